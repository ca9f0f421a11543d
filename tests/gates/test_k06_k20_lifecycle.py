"""Catalogue K06-K11, K14, K20: cursors, aborts, preemption and reset while jobs are in flight."""

from __future__ import annotations

import pytest
from story import (SCHEDULINGS, TINY, engine, follow_up, assert_healthy, pending_reads_as_miss, poisoned, run,
                   stored_chunks, tokens, without)

from kvoffload.core.jobs import JobRegistry
from kvoffload.engine.requests import RequestSpec


class TestK06CursorWaitsForHashes:
    """vLLM #36052 / #33881. Sync, k=5 drafts, all accepted: a decode step schedules 1 + 5 tokens,
    so computed + scheduled runs up to 5 positions past the last block that has a hash. The cursor
    must stop at the known keys and pick the rest up later: every chunk below A's final token is
    stored. Storing past the known keys is vLLM's `assert len(offload_keys) == len(block_ids)`."""

    CONFIG = TINY.replace(spec_tokens=5)

    def request(self):
        return RequestSpec("A", tokens(1, 8), tokens(2, 13), accept_counts=(5,))

    def test_every_decode_chunk_is_stored(self):
        record = run([self.request()], self.CONFIG, strict=True)
        assert_healthy(record)
        assert stored_chunks(record, "A") == {0, 1, 2, 3, 4}  # 21 tokens, position 20 never computed


class TestK07AbortOfAQueuedRequest:
    """vLLM #49118 / #49146 / #49285. One sequence at a time: Q (16 tokens, hashes known at arrival,
    no blocks) waits behind R and is aborted after one step. Its finished-path store walk must
    build nothing; the release that used num_tokens as the watermark and no allocated-block clamp
    died of the assert on Q."""

    CONFIG = TINY.replace(max_num_seqs=1)

    def requests(self):
        return [RequestSpec("R", tokens(1, 16), tokens(2, 4)),
                RequestSpec("Q", tokens(3, 16), tokens(4, 4), abort_after_steps=1)]

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_fixed_builds_nothing_for_q(self, scheduling):
        record = run(self.requests(), self.CONFIG.replace(scheduling=scheduling), strict=True)
        assert_healthy(record)
        assert record.finished_requests == 2
        assert stored_chunks(record, "Q") == set()

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_both_fixes_off_is_the_assert_on_q(self, scheduling):
        record = run(self.requests(), self.CONFIG.replace(scheduling=scheduling),
                     without("storable_within_allocated", "aborted_watermark"))
        assert record.crash == ("ConnectorCrash: assert len(offload_keys) == len(block_ids) failed for 'Q': "
                                "chunks 0..4, 4 keys, 0 blocks")


    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    @pytest.mark.parametrize("budget, bad_slots", [(6, 2), (7, 1)])
    @pytest.mark.parametrize("fixed", [True, False])
    def test_abort_mid_prefill_stores_only_computed_tokens(self, scheduling, budget, bad_slots, fixed):
        """vLLM #49285: A (40-token prompt) is aborted after its first step, with 6 or 7 tokens
        computed and blocks for positions 0-7. Only chunk 0 is written; the prompt as watermark
        stores chunk 1 with its unwritten slots (6-7, or 7), and C (A's prompt + 4) loads them.
        Seven computed tokens is the case a watermark one token too far gets wrong."""
        a = RequestSpec("A", tokens(1, 40), tokens(2, 2), abort_after_steps=1)
        c = RequestSpec("C", a.prompt_token_ids + tokens(3, 4), tokens(4, 2), arrival_step=5)
        record = run([a, c], TINY.replace(max_num_batched_tokens=budget, scheduling=scheduling),
                     None if fixed else without("aborted_watermark"))
        assert stored_chunks(record, "A") == ({0} if fixed else {0, 1})
        assert poisoned(record) == ([] if fixed else [("C", 1, bad_slots)])


class TestK08CompletionForAnAbortedRequest:
    """vLLM #43226 / LMCache #3499. C (A's history + 4) loads chunks 0-1 with 3-step copies and is
    aborted while its load is in flight (the GPU cache forgot A's blocks before step 3); D is
    aborted with its prefill's store in flight. Each completion must map to a request the
    connector still tracks; then all are released."""

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_aborts_with_a_load_and_a_store_in_flight(self, scheduling):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        c = follow_up(a, abort_after_steps=4)  # its load (built in step 5 or 6) copies for 3 steps
        d = RequestSpec("D", tokens(5, 12), tokens(6, 8), arrival_step=6, abort_after_steps=2)
        eng = engine([a, c, d], TINY.replace(scheduling=scheduling, store_completion_steps=3), strict=True,
                     forget_gpu_cache_before=(3,))
        record = eng.run()
        assert_healthy(record)
        assert [e["args"]["chunks"] for e in record.trace_events if e["name"].startswith("load")] == [[0, 1]]
        assert stored_chunks(record, "D") == {0, 1, 2}  # its prefill, in flight when aborted
        assert eng.connector.tracked_request_ids() == ()


class TestK09PreemptedStoresAreFlushed:
    """vLLM #29870. Sync and async, 8 usable blocks: A and B (16 tokens each) prefill in step 0
    and fill them; their stores are submitted at the start of step 1. In step 1 A's decode needs a
    5th block and preempts B, whose block 8 A takes and writes. B's store of chunk 3 (block 8) must
    be waited on before that forward; else it copies A's KV, and B's own resume loads it back."""

    @pytest.mark.parametrize("scheduling, flushed", [("sync", True), ("sync", False), ("async", True)])
    def test_preemption_waits_for_the_victims_stores(self, scheduling, flushed, monkeypatch):
        a = RequestSpec("A", tokens(1, 16), tokens(2, 4))
        b = RequestSpec("B", tokens(3, 16), tokens(4, 4))
        eng = engine([a, b], TINY.replace(gpu_blocks=9, scheduling=scheduling, store_completion_steps=2))
        if not flushed:  # the flush of preempted requests' jobs, gone
            monkeypatch.setattr(eng.connector.jobs, "jobs_of", lambda req_id: ())
        record = eng.run()
        assert record.preemptions == 1
        assert [(p.req_id, p.chunk, p.bad_slots) for p in record.poisoned] == ([] if flushed else [("B", 3, 1)])
        assert [(v.step, v.block, v.writer) for v in record.fence_violations] == (
            [] if flushed else [(1, 8, "forward")])


class TestK10NoLoadWhileStoresAreInFlight:
    """vLLM #46014 / #46231 (async). Budget 4: R's prefill stores one chunk per step. A's decode preempts R; R's flushed stores are copied but not yet reported, and the GPU
    cache loses R's blocks. On re-admission a tier that reads pending chunks as absent reports a
    hit on R's own finished chunks: the lookup must wait until R's jobs drain, else the load is
    built while stores are tracked (vLLM's `assert not transfer_jobs`)."""

    CONFIG = TINY.replace(gpu_blocks=8, scheduling="async", store_completion_steps=1, max_num_batched_tokens=4)

    def replay(self, fixes):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 12))
        r = RequestSpec("R", tokens(3, 12), tokens(4, 4))
        eng = engine([a, r], self.CONFIG, fixes, forget_gpu_cache_before=(7,))  # R was preempted in step 6
        pending_reads_as_miss(eng)
        return eng.run(), eng

    def test_fixed_defers_then_loads(self):
        record, eng = self.replay(None)
        assert_healthy(record)
        assert eng.connector.stats.deferred_lookups >= 1
        assert poisoned(record) == []


class TestK11CursorAfterPreemption:
    """vLLM #52170 / #52211 / #55503. Preempt -> resume under spec decode (k=2): the connector's
    block table is rebuilt on re-admission while its cursor is kept. Whatever chunk the walk
    reaches must have a block and a key; every chunk below each final token ends up stored."""

    def test_preempted_spec_decode_requests_store_everything(self):
        config = TINY.replace(gpu_blocks=11, spec_tokens=2, store_completion_steps=2)
        requests = [RequestSpec(f"R{i}", tokens(i, 10), tokens(i + 10, 14), accept_counts=(2, 0, 1))
                    for i in range(3)]
        record = run(requests, config, strict=True)
        assert record.preemptions >= 1
        assert_healthy(record)
        for i in range(3):
            assert stored_chunks(record, f"R{i}") == {0, 1, 2, 3, 4}  # 24 tokens, position 23 unwritten


class TestK14DuplicateBlockIdsInTheFence:
    """vLLM #42761 (b) / LIL#197: one store listing a physical block twice (lockstep groups) was
    filed twice in the block -> jobs index, and removed twice: KeyError. (Part (a), stale SWA
    blocks, needs sliding-window groups: see README.)"""

    def test_a_repeated_block_is_fenced_and_released_once(self):
        registry = JobRegistry()
        job = registry.add_store("A", (b"k0", b"k1"), (5, 5, 6), fence_now=True)
        assert registry.stores_reading([5]) == {job}
        registry.check_invariants()
        assert registry.acknowledge(job) is not None
        assert registry.fenced_blocks == frozenset() and len(registry) == 0
        registry.check_invariants()


class TestK20ResetForgetsRequestJobs:
    """vLLM #48102. 8 usable blocks: R1 is preempted by R0 with its store in flight (4-step copies);
    reset_cache at step 3 drops the store and its late completion is stale. Job ids the reset
    forgot are looked up later (vLLM 0.25: the surviving R0's next store, a KeyError; in the
    original report R1's lookups deferring forever)."""

    def requests(self):
        return [RequestSpec("R0", tokens(1, 16), tokens(2, 10)), RequestSpec("R1", tokens(3, 8), tokens(4, 10))]

    CONFIG = TINY.replace(gpu_blocks=9, store_completion_steps=4)

    def test_fixed_r1_is_readmitted(self):
        record = run(self.requests(), self.CONFIG, reset_cache_at=[3], strict=True)
        assert record.preemptions == 1
        assert_healthy(record)
        assert record.finished_requests == 2

    def test_stale_job_ids_break_the_survivors(self):
        """vLLM 0.25: the surviving R0's next store looks its dropped job id up (KeyError)."""
        record = run(self.requests(), self.CONFIG, without("reset_clears_request_jobs"), reset_cache_at=[3])
        assert record.crash == "ConnectorCrash: KeyError in _build_store_jobs: job 0 of 'R0' was dropped by reset_cache"
        assert record.finished_requests == 0
