"""Catalogue K14-K19 on hybrid models: KV cache groups (docs/engine.md, "Hybrid models").

The model is ``gpt-oss-tiny``: full attention (group 0) and an 8-token sliding window (group 1);
block size 4, one block per chunk. A window's blocks behind it go back to the pool while its
request runs. K18's is ``qwen3-next``: full attention and a Mamba group in align mode (group 1),
block size 16. K15-K17 need what the engine does not model (catalogue.NO_GATE says what), K19 what
it does not hand a connector yet (catalogue.VLLM_ONLY).
"""

from __future__ import annotations

import pytest
from planted import StaleWindowBlocksScheduler, UnfencedWindowScheduler, UnroundedMambaHitScheduler
from story import SCHEDULINGS, TINY, assert_healthy, engine, healthy, poisoned, tokens

from kvoffload.core.fixes import PRESETS, Fixes
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


# The presets whose release rules can replay a Mamba group (Fixes.check_model refuses the others).
MAMBA_PRESETS = tuple(name for name, preset in PRESETS.items() if preset.rules.mamba_boundary_hand_off)


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
