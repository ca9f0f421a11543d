"""Catalogue K14-K19 in vLLM's scheduler, on a hybrid model: KV cache groups, against the
connector named by ``--kv-connector``.

The model is ``gpt-oss-tiny`` (``kvoffload.core.model``): full attention and an 8-token sliding
window, block size 4, one block per chunk; vLLM's scheduler frees a window's blocks behind it
while the request runs; K17's, K18's and K19's is ``qwen3-next`` (full attention and Mamba). K15
and K16 need groups of different block sizes (``test_k15_k16_block_sizes.py``).
"""

from __future__ import annotations

import pytest

from kvoffload.engine.requests import RequestSpec
from kvoffload.gates.story import TINY, assert_clean, assert_whole_prompt_served, forget_free_blocks, replay, tokens

DECLINES = "needs a tier whose allocation fails on demand: the reference's manager or vLLM's CPU manager"
ONE_GROUP = ("needs a window group: vLLM turns its hybrid KV cache manager off for a connector that is not "
             "SupportsHMA (ExampleConnector, a MultiConnector with such a child) and runs every layer as full "
             "attention in one group, so no block is freed behind a window (docs/connectors.md)")
NOTHING_TO_FENCE = ("the story never reached its fence: this connector stored no window chunk that C could load "
                    "(served 0 tokens, no poisoned load); SimpleCPU stores a block the step after its forward, "
                    "when the window has already freed it, ExampleConnector only an exact prompt "
                    "(docs/connectors.md)")
NOTHING_SERVED = ("the story never reached a hit: this connector stored nothing the repeat could load (served 0 "
                  "tokens, no poisoned load)")


def assert_served_back(record, kv_connector, tokens_back: int) -> None:
    """The Mamba stories' ending: clean, both requests finished; a foreign connector that stored
    nothing the repeat could load skips (its hit rate, not this gate's bug); any other connector
    gets ``tokens_back`` tokens back, at least a chunk (16) of them from the tier."""
    from kvoffload.vllm.foreign import family_of

    assert_clean(record, finished=2)
    if record.connector_hit_tokens_admitted == 0 and family_of(kv_connector.source) is not None:
        pytest.skip(NOTHING_SERVED)
    assert_whole_prompt_served(record, tokens_back, connector_at_least=16)


def window_groups(built) -> None:
    """``prepare`` of a hybrid story: skip unless vLLM gave the connector the model's window
    group (``build.kv_cache_groups``: vLLM's own choice of one group for a non-HMA connector)."""
    if len(built.scheduler.kv_cache_config.kv_cache_groups) < 2:
        pytest.skip(ONE_GROUP)


def declines_stores_of(req_id: str, until_step: int):
    """``prepare`` for a replay whose tier answers ``prepare_store`` with None (full, nothing
    evictable) for ``req_id`` before ``until_step``: vLLM's CPU manager (the stock connector) or
    the reference's; any other connector skips."""
    def prepare(built) -> None:
        window_groups(built)
        connector = built.scheduler.connector
        core = getattr(connector, "core", None)
        if core is not None:
            manager, plain = core.manager, core.manager.prepare_store

            def declining(req, keys, positions=None):
                return None if req == req_id and built._step < until_step else plain(req, keys, positions)
        else:
            inner = getattr(connector, "connector_scheduler", None)
            if inner is None:
                pytest.skip(DECLINES)
            manager, plain = inner.manager, inner.manager.prepare_store

            def declining(keys, req_context):
                return None if req_context.req_id == req_id and built._step < until_step else plain(keys, req_context)
        manager.prepare_store = declining
    return prepare


class TestK14StaleWindowBlockIsNotStored:
    """vLLM #42761 (a) / PR #42959. Dense retention (every window chunk is stored), 9 usable
    blocks. A (8 tokens, decoding) cannot store for its first 5 steps (the tier declines);
    meanwhile its window slides past block 0, which vLLM frees and hands to B. When A's store
    goes through it must skip window chunk 0, whose block holds B's KV: C (A's 8 tokens + 4, after
    the GPU cache forgot them) would load it."""

    def test_the_reused_window_block_is_never_stored(self, kv_connector):
        requests = [RequestSpec("A", tokens(1, 8), tokens(2, 12)),
                    RequestSpec("B", tokens(3, 8), tokens(4, 8), arrival_step=3),
                    RequestSpec("C", tokens(1, 8) + tokens(5, 4), tokens(6, 2), arrival_step=20)]
        config = TINY.replace(model="gpt-oss-tiny", prefix_cache_retention_interval=None, gpu_blocks=10)
        record, _ = replay(kv_connector, requests, config, forget_gpu_cache_before=(20,),
                           prepare=declines_stores_of("A", until_step=5))
        assert_clean(record, finished=3)


class TestK14WindowBlockFencedWhileItsStoreWaits:
    """K14's fence half: a window's source blocks are watched from the store's creation (vLLM
    0.32 ``_build_store_jobs``, ``fenced_block_ids``), because the scheduler frees them behind the
    window while the request runs. 12 usable blocks, sync. A (16 tokens) is prefilled at step 0 and
    its store of window chunks 1 and 2 is queued; at step 1 A's window slides past blocks 0 and 1,
    which B takes in the same schedule. The store must be flushed before B's forward writes the
    block: C (A's 16 tokens + 4, after the GPU cache forgot them) loads window chunks 1 and 2."""

    def test_the_schedule_that_reuses_a_window_block_flushes_its_store(self, kv_connector):
        from kvoffload.vllm.foreign import family_of

        requests = [RequestSpec("A", tokens(1, 16), tokens(2, 4)),
                    RequestSpec("B", tokens(3, 8), tokens(4, 4), arrival_step=1),
                    RequestSpec("C", tokens(1, 16) + tokens(5, 4), tokens(6, 2), arrival_step=20)]
        config = TINY.replace(model="gpt-oss-tiny", gpu_blocks=13, scheduling="sync")
        record, _ = replay(kv_connector, requests, config, forget_gpu_cache_before=(20,), prepare=window_groups)
        assert_clean(record, finished=3)
        if record.connector_hit_tokens_admitted == 0 and family_of(kv_connector.source) is not None:
            # A foreign connector that never queues a store on the block the window frees has
            # nothing to fence: not a pass, not this gate's bug. The reference, vLLM's stock
            # connector and their planted copies must still serve C.
            pytest.skip(NOTHING_TO_FENCE)
        # C's load happened (chunks 0-2 of both groups; the releases up to 0.29, which stored every
        # window chunk, serve chunk 3 too)
        assert record.connector_hit_tokens_admitted >= 12


MAMBA = TINY.replace(model="qwen3-next", block_size=16, gpu_blocks=64)


class TestK17DrafterGroupsOnHybrids:
    """vLLM #52735 (PRs #52771, #52807; fixed in 0.30.0). ``qwen3-next`` with an EAGLE drafter
    (the engine setting ``eagle_drafts``: vLLM's SpeculativeConfig, no drafts proposed) and, as for
    a shared-group MTP model, no KV cache group flagged a drafter: vLLM 0.25-0.29's connector then
    took every group for one (``SchedulerOffloadConfig.from_spec``); a drafter group drops its
    trailing chunk from a lookup, the Mamba group's servable window is one chunk, so every hit was
    0 while the stores looked healthy. B (P = 64 tokens, + 6): under EAGLE vLLM's scheduler
    checkpoints the Mamba state one block early, at 48 (``_mamba_block_aligned_split``). C = P + 4,
    after the GPU cache forgot B, must get those 48 tokens back (docs/hybrid.md, "Gates")."""

    def test_a_drafter_config_leaves_the_mamba_group_its_hit(self, kv_connector):
        from kvoffload.core.types import ConfigError

        p = tuple(range(1000, 1064))
        requests = [RequestSpec("B", p + tuple(range(5000, 5006)), tokens(2, 4)),
                    RequestSpec("C", p + tuple(range(6000, 6004)), tokens(3, 4), arrival_step=12)]
        try:
            record, _ = replay(kv_connector, requests, MAMBA.replace(eagle_drafts=1), forget_gpu_cache_before=(12,))
        except ConfigError as error:
            pytest.skip(f"cannot run a Mamba group with a drafter: {error}")
        assert_served_back(record, kv_connector, 48)


class TestK18MambaStateAtABoundary:
    """vLLM #44599 (fixed in 0.25.0). ``qwen3-next``: full attention and a Mamba group in align
    mode, block size 16 (the simulator's story of the same name: tests/gates). A Mamba
    state summarises every token before it, so a hit must end exactly where a stored state does.
    B (P = 64 tokens, + 6) stores the state at 64, its prompt's replay boundary. C = P exactly,
    after the GPU cache forgot B: a lookup may serve at most 63 tokens (one must be computed), and
    63 is not a state boundary, so it must round down to one (48, never stored: no hit). Serving
    63 tokens with the state of 64 applies the last prompt token twice: the KV oracle finds the
    restored state summarising 64 tokens where C resumes after 63 (vllm/model.py, StateCells)."""

    def test_an_exact_resend_never_resumes_from_a_later_state(self, kv_connector):
        from kvoffload.core.types import ConfigError

        p = tuple(range(1000, 1064))
        requests = [RequestSpec("B", p + tuple(range(5000, 5006)), tokens(2, 4)),
                    RequestSpec("C", p, tokens(3, 4), arrival_step=12)]
        try:
            record, _ = replay(kv_connector, requests, MAMBA, forget_gpu_cache_before=(12,))
        except ConfigError as error:  # a connector or release that cannot run a Mamba group here
            pytest.skip(f"cannot run a Mamba group: {error}")
        assert_clean(record, finished=2)


def loses_all_but_the_head(req_id: str, head_blocks: int, before_step: int):
    """``prepare`` of a story in which memory pressure takes every free block of the GPU prefix
    cache before ``before_step`` except the first ``head_blocks`` full-attention blocks of
    ``req_id`` (noted while it runs): the cache keeps a prefix's attention and loses the Mamba
    states at its end, so the groups' local hits diverge."""
    def prepare(built) -> None:
        scheduler, plain, head = built.scheduler, built.on_step, set()
        groups = scheduler.kv_cache_config.kv_cache_groups
        attention = next(i for i, g in enumerate(groups) if type(g.kv_cache_spec).__name__ == "FullAttentionSpec")

        def on_step(next_step: int, finished: int) -> None:
            if req_id in scheduler.requests:
                head.update(scheduler.kv_cache_manager.get_block_ids(req_id)[attention][:head_blocks])
            if next_step == before_step:
                forget_free_blocks(scheduler.kv_cache_manager.block_pool, keep=head)
            if plain is not None:
                plain(next_step, finished)
        built.on_step = on_step
    return prepare


class TestK19DivergentLocalHitsOfAHybrid:
    """vLLM #43884, #46453, #50454. ``qwen3-next``, block size 16. B0 (P = 48 tokens, + 30) runs;
    then memory pressure takes all of the GPU cache but P's three attention blocks: the groups'
    local hits diverge (48 tokens of attention, no Mamba state). vLLM 0.27 tells every connector
    the deeper attention hit, 0.28+ only one that sets ``supports_divergent_local_hybrid_hits``
    (``KVCacheManager.get_computed_blocks_for_connector``); such a connector must bring, with the
    attention it loads past it, the Mamba state of the boundary it serves (64), or B resumes from
    a state no forward wrote. Any other sees the hit every group agrees on (none) and serves the
    whole prefix. B (B0's prompt + 4) gets its 64 tokens back, clean."""

    def test_a_hit_the_groups_disagree_on_resumes_from_the_state_it_serves(self, kv_connector):
        from kvoffload.core.types import ConfigError

        prompt = tuple(range(1000, 1048)) + tuple(range(5000, 5030))
        requests = [RequestSpec("B0", prompt, tokens(2, 4)),
                    RequestSpec("B", prompt + tuple(range(7000, 7004)), tokens(3, 4), arrival_step=12)]
        try:
            record, _ = replay(kv_connector, requests, MAMBA, prepare=loses_all_but_the_head("B0", 3, before_step=12))
        except ConfigError as error:
            pytest.skip(f"cannot run a Mamba group: {error}")
        assert_served_back(record, kv_connector, 64)
