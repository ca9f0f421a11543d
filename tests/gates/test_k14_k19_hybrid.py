"""Catalogue K14-K19 on hybrid models: KV cache groups (docs/engine.md, "Hybrid models").

The model is ``gpt-oss-tiny``: full attention (group 0) and an 8-token sliding window (group 1);
block size 4, one block per chunk. A window's blocks behind it go back to the pool while its
request runs. K17's, K18's and K19's is ``qwen3-next``: full attention and a Mamba group in align
mode (group 1), block size 16; K17's with an EAGLE drafter (``eagle_drafts``). K15 and K16 (groups
of different block sizes) are in test_k15_k16_block_sizes.py.
"""

from __future__ import annotations

import dataclasses

import pytest
from planted import (StaleWindowBlocksScheduler, StatelessDivergentLoadScheduler, UnfencedWindowScheduler,
                     UnroundedMambaHitScheduler)
from story import SCHEDULINGS, TINY, assert_healthy, engine, healthy, poisoned, tokens

from kvoffload.core.fixes import PRESETS, Fixes
from kvoffload.core.hybrid import HybridConnectorScheduler
from kvoffload.engine.requests import RequestSpec


def window_chunks_stored(record, req_id: str) -> set[int]:
    """Group 1's chunks of ``req_id`` that a store job carried (the run's trace)."""
    return {chunk for event in record.trace_events if event["name"].startswith("store") and event["tid"] == req_id
            for chunk, group in zip(event["args"]["chunks"], event["args"]["groups"]) if group == 1}


def flushes_of(eng) -> list[tuple[int, int]]:
    """(step, job id) of every store a step's plan flushes, as the run goes."""
    flushed: list[tuple[int, int]] = []
    plan_of = eng.connector.build_connector_meta

    def watched(out):
        plan = plan_of(out)
        flushed.extend((eng._step, job) for job in plan.jobs_to_flush)
        return plan

    eng.connector.build_connector_meta = watched
    return flushed


class TestK14StaleWindowBlockIsNotStored:
    """vLLM #42761 (a) / PR #42959. Dense retention (every window chunk is stored), 9 usable
    blocks. A (8 tokens, decoding) cannot store for its first 5 steps (the tier declines:
    allocation failures); meanwhile its window slides past block 0, which the engine frees and
    hands to B. When A's store finally goes through it must skip window chunk 0: the block now
    holds B's KV. C (A's 8 tokens + 4, after the GPU cache forgot them) would load it."""

    CONFIG = TINY.replace(model="gpt-oss-tiny", prefix_cache_retention_interval=None, gpu_blocks=10)

    def requests(self):
        return [RequestSpec("A", tokens(1, 8), tokens(2, 12)),
                RequestSpec("B", tokens(3, 8), tokens(4, 8), arrival_step=3),
                RequestSpec("C", tokens(1, 8) + tokens(5, 4), tokens(6, 2), arrival_step=20)]

    def replay(self, connector_class=None):
        eng = engine(self.requests(), self.CONFIG, forget_gpu_cache_before=(20,))
        if connector_class is not None:
            eng.connector = eng.scheduler.connector = connector_class(self.CONFIG.connector_config(), eng.fixes)
        manager = eng.connector.manager
        plain = manager.prepare_store

        def declines_a_while(req_id, keys, positions=None):
            if req_id == "A" and eng._step < 5:
                return None  # the tier is full (vLLM's prepare_store answering None)
            return plain(req_id, keys, positions)

        manager.prepare_store = declines_a_while
        return eng.run()

    def test_the_reused_window_block_is_never_stored(self):
        record = self.replay()
        assert healthy(record) and record.finished_requests == 3
        assert window_chunks_stored(record, "A") == {1, 2, 3}  # chunk 0's block went to B at step 3
        assert record.connector_hit_tokens_admitted == 0  # C's window needs chunk 0: a miss, not B's KV

    def test_with_the_stale_block_stored_the_next_load_is_poisoned(self):
        """The bug planted (the zeroing of PR #42959 removed): A stores B's KV under its window
        chunk 0, and C loads it (4 slots, group 1)."""
        record = self.replay(StaleWindowBlocksScheduler)
        assert window_chunks_stored(record, "A") == {0, 1, 2, 3}
        assert poisoned(record) == [("C", 0, 4)] and record.poisoned[0].group == 1


class TestK14WindowBlockFencedWhileItsStoreWaits:
    """K14's fence half: vLLM 0.32 ``_build_store_jobs`` watches a window's source blocks
    (``fenced_block_ids``) from the store's creation, because the engine frees them behind the
    window while the request runs; full attention's only when the request finishes. 12 usable
    blocks, sync. Step 0: A (16 tokens) is prefilled and its store of window chunks 1 and 2 (the
    two before the prompt's replay boundary) is queued for the next step. Step 1: A's window
    slides past blocks 0 and 1, which go back to the pool and on to B in the same schedule; the
    fence makes that schedule flush A's store, so it copies before B's forward writes the block.
    C (A's 16 tokens + 4, after the GPU cache forgot them) loads window chunks 1 and 2."""

    CONFIG = TINY.replace(model="gpt-oss-tiny", gpu_blocks=13)

    def requests(self):
        return [RequestSpec("A", tokens(1, 16), tokens(2, 4)),
                RequestSpec("B", tokens(3, 8), tokens(4, 4), arrival_step=1),
                RequestSpec("C", tokens(1, 16) + tokens(5, 4), tokens(6, 2), arrival_step=20)]

    def test_the_schedule_that_reuses_a_window_block_flushes_its_store(self):
        eng = engine(self.requests(), self.CONFIG, forget_gpu_cache_before=(20,))
        flushed = flushes_of(eng)
        record = eng.run()
        assert healthy(record) and record.finished_requests == 3
        assert window_chunks_stored(record, "A") == {1, 2}
        store_owner = {int(event["name"].split()[1]): event["tid"] for event in record.trace_events
                       if event["name"].startswith("store")}
        assert (1, "A") in {(step, store_owner[job]) for step, job in flushed}
        assert record.connector_hit_tokens_admitted == 12  # C: chunks 0-2 of both groups

    def test_unfenced_the_store_copies_the_new_owners_kv(self):
        """The bug planted (the window's blocks fenced only at finish, like full attention's):
        nothing flushes A's store, the worker copies block 1 after B's forward wrote it, and C
        loads B's KV as A's window chunk 1."""
        eng = engine(self.requests(), self.CONFIG, forget_gpu_cache_before=(20,))
        eng.connector = eng.scheduler.connector = UnfencedWindowScheduler(self.CONFIG.connector_config(), eng.fixes)
        record = eng.run()
        assert poisoned(record) == [("C", 1, 4)] and record.poisoned[0].group == 1


# Every preset replays a Mamba group: 0.29's and later store the hand-off's states, 0.25's and
# 0.26's from the block table (ReleaseRules.mamba_stores).
MAMBA_PRESETS = tuple(PRESETS)


class TestK18MambaStateAtABoundary:
    """vLLM #44599 (fixed in 0.25.0). ``qwen3-next``, block size 16, one block per chunk. A Mamba
    state summarises every token before it, so a hit must end exactly where a stored state does.
    B (P = 64 tokens, + 6) stores the state at 64, its prompt's replay boundary. C = P exactly,
    after the GPU cache forgot B: a lookup may serve at most 63 tokens (one must be computed), and
    63 is not a state boundary, so it must round down to one (48, never stored: no hit). Served 63
    tokens with the state of 64, C would apply its last prompt token twice: the KV oracle finds
    the restored state summarising 64 tokens where C resumes after 63 (engine/oracle.py)."""

    CONFIG = TINY.replace(model="qwen3-next", block_size=16, gpu_blocks=64)

    def requests(self):
        p = tuple(range(1000, 1064))
        return [RequestSpec("B", p + tuple(range(5000, 5006)), tokens(2, 4)),
                RequestSpec("C", p, tokens(3, 4), arrival_step=12)]

    def replay(self, scheduling: str, fixes: Fixes | None = None, connector_class=None):
        config = self.CONFIG.replace(scheduling=scheduling)
        eng = engine(self.requests(), config, fixes, forget_gpu_cache_before=(12,))
        if connector_class is not None:
            eng.connector = eng.scheduler.connector = connector_class(config.connector_config(), eng.fixes)
        return eng.run()

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    @pytest.mark.parametrize("preset", (None,) + MAMBA_PRESETS)
    def test_an_exact_resend_never_resumes_from_a_later_state(self, scheduling, preset):
        record = self.replay(scheduling, Fixes.preset(preset) if preset else None)
        assert_healthy(record)
        assert record.finished_requests == 2
        assert window_chunks_stored(record, "B") == {3}  # group 1's: the state at 64, B's replay boundary
        assert record.connector_hit_tokens_admitted == 0  # 63 rounds down to 48: no state there, no hit

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_without_the_round_down_c_resumes_from_the_state_of_64(self, scheduling):
        """The bug planted (no fix flag: every release modelled rounds down): C is served 63
        tokens with the state of 64, one poisoned state in group 1, chunk 3, as in vLLM's
        scheduler (tests/vllm/test_mamba.py)."""
        record = self.replay(scheduling, connector_class=UnroundedMambaHitScheduler)
        assert record.connector_hit_tokens_admitted == 63
        assert poisoned(record) == [("C", 3, 1)] and record.poisoned[0].group == 1


class TestK17DrafterGroupsOnHybrids:
    """vLLM #52735 (PRs #52771, #52807; fixed in 0.30.0). ``qwen3-next`` with an EAGLE drafter of
    one token (``eagle_drafts``; engine/drafter.py) whose KV shares the target's groups, none
    flagged a drafter's (a shared-group MTP model). The engine checkpoints B's Mamba state one
    block early, at 48 (``_mamba_block_aligned_split``), and keeps that state (``replay_boundaries``
    under EAGLE). vLLM 0.25-0.29's connector took every group for a drafter's
    (``ReleaseRules.unflagged_groups_draft``): a drafter group drops the last chunk it finds, and
    the Mamba group, a window of one chunk, then needs the state at 32 too, never stored: C (B's
    64 + 4, after the GPU cache forgot B) is served 0 instead of 48 (docs/hybrid.md, "Gates")."""

    CONFIG = TINY.replace(model="qwen3-next", block_size=16, gpu_blocks=64, eagle_drafts=1)

    def requests(self):
        p = tuple(range(1000, 1064))
        return [RequestSpec("B", p + tuple(range(5000, 5006)), tokens(2, 4)),
                RequestSpec("C", p + tuple(range(6000, 6004)), tokens(3, 4), arrival_step=12)]

    def replay(self, scheduling: str, fixes: Fixes | None = None, **changes):
        config = self.CONFIG.replace(scheduling=scheduling, **changes)
        return engine(self.requests(), config, fixes, forget_gpu_cache_before=(12,)).run()

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_c_gets_the_state_checkpointed_a_block_early(self, scheduling):
        record = self.replay(scheduling)
        assert_healthy(record)
        assert record.finished_requests == 2
        assert window_chunks_stored(record, "B") == {2}  # the Mamba state at 48, not at 64
        assert record.connector_hit_tokens_admitted == 48

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_without_a_drafter_the_state_is_at_64(self, scheduling):
        """The story with n-gram's rules (no EAGLE): B's state is at its replay boundary, 64."""
        record = self.replay(scheduling, eagle_drafts=0)
        assert window_chunks_stored(record, "B") == {3}
        assert record.connector_hit_tokens_admitted == 64

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_every_group_a_drafter_serves_nothing(self, scheduling):
        """The bug planted into the reference: its 0.32 rules, every group taken for a drafter's."""
        rules = dataclasses.replace(Fixes().rules, unflagged_groups_draft=True)
        record = self.replay(scheduling, Fixes(rules=rules))
        assert_healthy(record)
        assert window_chunks_stored(record, "B") == {2}  # the stores look healthy
        assert record.connector_hit_tokens_admitted == 0

    @pytest.mark.parametrize("preset", MAMBA_PRESETS)
    def test_the_presets_fail_as_their_releases(self, preset):
        """vllm-0.25, 0.26, 0.28 and 0.29 take every group for a drafter's and serve 0, as
        0.25.0-0.28.0 do in vLLM's scheduler (0.29.0 serves 0 for a reason of its own too, docs/hybrid.md);
        vllm-0.30 serves 48."""
        record = self.replay("sync", Fixes.preset(preset))
        assert_healthy(record)
        served = 0 if PRESETS[preset].rules.unflagged_groups_draft else 48
        assert record.connector_hit_tokens_admitted == served
        assert {name for name, p in PRESETS.items() if p.rules.unflagged_groups_draft} == \
            {"vllm-0.25", "vllm-0.26", "vllm-0.28", "vllm-0.29"}


class OptedInScheduler(HybridConnectorScheduler):
    """The reference, opted in to the deeper full-attention hit of a hybrid (vLLM 0.28+'s
    ``supports_divergent_local_hybrid_hits``; the reference's own is False, as vLLM's base)."""

    supports_divergent_local_hybrid_hits = True


class TestK19DivergentLocalHitsOfAHybrid:
    """vLLM #43884, #46453, #50454. ``qwen3-next``, block size 16. B0 (P = 48 tokens, + 30) runs;
    then memory pressure takes all of the GPU cache but P's three attention blocks: the groups'
    local hits diverge (48 tokens of attention, no Mamba state). vLLM 0.28+ tells only a connector
    that sets ``supports_divergent_local_hybrid_hits`` the deeper attention hit
    (``Scheduler._get_local_prefix_cache_hit``, ``get_computed_blocks_for_connector``; the engine
    follows 0.32); such a connector must bring, with the attention it loads past it, the Mamba
    state of the boundary it serves (64), or B resumes from a state no forward wrote, and when it
    finds nothing the engine falls back to the hit every group agrees on. Any other connector is
    told that agreed hit (none) and serves the whole prefix. B (B0's prompt + 4) gets its 64
    tokens back, clean."""

    CONFIG = TINY.replace(model="qwen3-next", block_size=16, gpu_blocks=64)

    def requests(self):
        prompt = tuple(range(1000, 1048)) + tuple(range(5000, 5030))
        return [RequestSpec("B0", prompt, tokens(2, 4)),
                RequestSpec("B", prompt + tuple(range(7000, 7004)), tokens(3, 4), arrival_step=12)]

    def replay(self, scheduling: str, connector_class=None, tier_declines: bool = False):
        """B0's first three attention blocks, noted while it runs, are all the GPU cache keeps
        before step 12. ``tier_declines``: the tier takes no store (nothing to serve)."""
        config = self.CONFIG.replace(scheduling=scheduling)
        engines, head = [], set()

        def loses_all_but_the_head(next_step: int, finished: int) -> None:
            live = engines[0].scheduler.live.get("B0")
            if live is not None and live.tables:
                head.update(live.tables[0][:3])
            if next_step == 12:
                engines[0].pool.uncache_free_blocks(keep=head)

        eng = engine(self.requests(), config, on_step=loses_all_but_the_head, skip_idle=False)
        engines.append(eng)
        if connector_class is not None:
            eng.connector = eng.scheduler.connector = connector_class(config.connector_config(), eng.fixes)
        if tier_declines:
            eng.connector.manager.prepare_store = lambda req_id, keys, positions=None: None
        return eng.run()

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    @pytest.mark.parametrize("opted_in", [False, True])
    def test_a_hit_the_groups_disagree_on_resumes_from_the_state_it_serves(self, scheduling, opted_in):
        record = self.replay(scheduling, OptedInScheduler if opted_in else None)
        assert_healthy(record)
        assert record.finished_requests == 2
        # B's first admission (B0 had none): GPU-hit and connector-hit tokens
        assert (record.gpu_hit_tokens, record.connector_hit_tokens_admitted) == ((48, 16) if opted_in else (0, 64))

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_opted_in_and_served_nothing_b_takes_the_hit_every_group_agrees_on(self, scheduling):
        """The tier holds nothing: told 48 tokens, the connector adds none, and B computes all of
        its prompt (the agreed hit, 0) instead of resuming at 48 with no Mamba state."""
        record = self.replay(scheduling, OptedInScheduler, tier_declines=True)
        assert_healthy(record)
        assert (record.gpu_hit_tokens, record.connector_hit_tokens_admitted) == (0, 0)

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_loading_the_attention_without_the_state_is_poisoned(self, scheduling):
        """The bug planted: opted in, the load carries chunk 3 of full attention and leaves the
        Mamba state out. B resumes at 64 from a block nothing wrote for it: one poisoned state,
        group 1, chunk 3, as in vLLM's scheduler (tests/vllm/test_k19_divergent_hits.py)."""
        record = self.replay(scheduling, StatelessDivergentLoadScheduler)
        assert (record.gpu_hit_tokens, record.connector_hit_tokens_admitted) == (48, 16)
        assert poisoned(record) == [("B", 3, 1)] and record.poisoned[0].group == 1
