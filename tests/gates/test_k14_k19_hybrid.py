"""Catalogue K14-K19 on hybrid models: KV cache groups (docs/engine.md, "Hybrid models").

The model is ``gpt-oss-tiny``: full attention (group 0) and an 8-token sliding window (group 1);
block size 4, one block per chunk. A window's blocks behind it go back to the pool while its
request runs. K15-K19 need what the engine does not model (catalogue.NO_GATE says what).
"""

from __future__ import annotations

from planted import StaleWindowBlocksScheduler, UnfencedWindowScheduler
from story import TINY, engine, healthy, poisoned, tokens

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
