"""An EAGLE drafter's cache rules in the engine (``eagle_drafts``, engine/drafter.py): what vLLM
0.32's scheduler and KV cache manager change under ``use_eagle()``, one story each
(docs/engine.md, "Hybrid models"). The model is ``qwen3-next`` at block size 16, one block per
chunk; B's prompt is 70 tokens (64 shared with C, whose prompt is 68)."""

from __future__ import annotations

import pytest

from kvoffload.core.types import ConfigError
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.drafter import checkpoint_position, decode_step_slots, replay_boundaries
from kvoffload.engine.engine import Engine
from kvoffload.engine.kv_groups import HybridKV
from kvoffload.engine.requests import RequestSpec

QWEN = EngineConfig(model="qwen3-next", block_size=16, gpu_blocks=64, cpu_chunks=64, max_num_seqs=8,
                    max_num_batched_tokens=64)
P = tuple(range(1000, 1064))


def story(config: EngineConfig, forget_before: int | None = None):
    """B (P + 6 tokens, 4 outputs), then C (P + 4) at step 12; with ``forget_before`` the GPU
    prefix cache loses every free block before that step."""
    requests = [RequestSpec("B", P + tuple(range(5000, 5006)), tuple(range(2000, 2004))),
                RequestSpec("C", P + tuple(range(6000, 6004)), tuple(range(3000, 3004)), arrival_step=12)]
    engines: list[Engine] = []

    def forget(next_step: int, finished: int) -> None:
        if next_step == forget_before:
            engines[0].pool.uncache_free_blocks()

    engines.append(Engine(requests, config, max_steps=200, trace=True, on_step=forget, skip_idle=False))
    return engines[0].run()


def mamba_stores(record, req_id: str) -> set[int]:
    return {chunk for event in record.trace_events if event["name"].startswith("store") and event["tid"] == req_id
            for chunk, group in zip(event["args"]["chunks"], event["args"]["groups"]) if group == 1}


def test_the_checkpoint_is_a_block_early():
    """``get_mamba_prefill_checkpoint_position``: 70 tokens checkpoint at 64 (69 rounded down),
    48 under EAGLE (70 rounded down, less a block); a block-aligned 64 at 48 and 48."""
    assert [checkpoint_position(n, 16, False) for n in (70, 64, 16, 5)] == [64, 48, 0, 0]
    assert [checkpoint_position(n, 16, True) for n in (70, 64, 16, 5)] == [48, 48, 0, 0]


def test_the_replay_boundaries_drop_a_block():
    """``replay_boundaries``: one position (``P - 1``) without EAGLE; a resend's and a longer
    sibling's, each a block lower, with it."""
    assert replay_boundaries(70, 16, False) == (69,)
    assert replay_boundaries(70, 16, True) == (48,)
    assert replay_boundaries(64, 16, True) == (32, 48)


@pytest.mark.parametrize("eagle, state", [(0, 3), (1, 2)])
def test_b_offers_the_state_of_its_checkpoint(eagle, state):
    """The prefill splits at the checkpoint and sparse retention (0) keeps the state a replay
    resumes at: chunk 3 (64) with n-gram's rules, chunk 2 (48) under EAGLE; C gets it back."""
    record = story(QWEN.replace(eagle_drafts=eagle), forget_before=12)
    assert mamba_stores(record, "B") == {state}
    assert record.connector_hit_tokens_admitted == (state + 1) * 16
    assert record.poisoned == [] and record.finished_requests == 2


@pytest.mark.parametrize("eagle, states", [(0, {2}), (1, {1, 2})])
def test_sparse_retention_keeps_both_replay_boundaries(eagle, states):
    """A block-aligned prompt (64 tokens) in 16-token chunks: retention 0 keeps the states a
    replay resumes at, 63's block (48) with n-gram's rules, under EAGLE a resend's (32) and a
    longer sibling's (48)."""
    requests = [RequestSpec("B", P, tuple(range(2000, 2004)))]
    config = QWEN.replace(eagle_drafts=eagle, max_num_batched_tokens=16)
    record = Engine(requests, config, max_steps=100, trace=True).run()
    assert mamba_stores(record, "B") == states


@pytest.mark.parametrize("eagle, hit", [(0, 64), (1, 48)])
def test_a_full_attention_hit_drops_its_last_block(eagle, hit):
    """Dense retention and 16-token chunks: B caches the states at 16, 32, 48 and 64 (EAGLE's
    checkpoint at 48 stops no chunk of 16). C's GPU hit: full attention finds 4 blocks; EAGLE
    looks one block further (none) and drops the last one, so the Mamba state at 48 is the hit."""
    config = QWEN.replace(eagle_drafts=eagle, prefix_cache_retention_interval=None, max_num_batched_tokens=16)
    record = story(config)
    assert record.gpu_hit_tokens == hit


def test_the_drafter_reserves_its_tokens_and_lookahead():
    """A Mamba row holds a speculative state block per draft token (``num_speculative_blocks``)
    and a decode step reserves ``1 + k`` slots plus the EAGLE lookahead (``num_lookahead_tokens``)."""
    eagle = QWEN.replace(eagle_drafts=2)
    assert HybridKV(eagle, BlockPool(64, 16)).mamba[1].speculative_blocks == 2
    assert decode_step_slots(eagle) == 5
    assert decode_step_slots(QWEN.replace(spec_tokens=2)) == 3
    assert decode_step_slots(QWEN) == 0


@pytest.mark.parametrize("changes, words", [
    ({"spec_tokens": 1}, "one drafter at most"),
    ({"model": "dense"}, "not 'dense'"),
    ({"model": "gpt-oss-tiny", "block_size": 4}, "not 'gpt-oss-tiny'"),
])
def test_what_is_not_modelled_is_refused(changes, words):
    with pytest.raises(ConfigError, match=words):
        QWEN.replace(eagle_drafts=1, **changes)
