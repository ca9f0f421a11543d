"""End-to-end replays through the engine: each historical bug, fix on (correct) and off (symptom).

Block size 4 and one block per chunk throughout, so chunk boundaries are easy to count: positions
0-3 are chunk 0, 4-7 chunk 1, and so on.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import replay
from kvoffload.engine.requests import RequestSpec

TINY = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))


def stored_chunks(record, req_id: str) -> set[int]:
    """Chunks of ``req_id`` that a store job carried (from the run's trace)."""
    return {chunk for event in record.trace_events if event["name"].startswith("store")
            and event["tid"] == req_id for chunk in event["args"]["chunks"]}


def two_turns(first_prompt=6, first_output=3, *, stop="length", extra=None, **first):
    """Turn A and its follow-up C, whose prompt is A's whole history plus 4 new tokens."""
    a = RequestSpec("A", tokens(1, first_prompt), tokens(2, first_output), stop=stop, **first)
    c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + tokens(3, 4), tokens(4, 2),
                    parent="A", think_steps=3)
    return [a, c] + list(extra or [])


class TestLastBlockAtFinish:
    """Async scheduling, length-capped answer whose last written position (7) closes chunk 1."""

    CONFIG = TINY.replace(scheduling="async")

    def filler(self):
        """Arrives as A finishes and takes 30 of the 31 blocks: A's cached prefix is evicted."""
        return RequestSpec("F", tokens(5, 120), tokens(6, 1), parent="A", think_steps=0)

    def test_the_final_block_is_cached_on_the_gpu_at_finish(self):
        """vLLM's AsyncScheduler caches blocks up to num_computed_tokens - placeholders at every
        output, the finishing one included: the follow-up hits all of A's written KV on the GPU."""
        record = replay(two_turns(), self.CONFIG, Fixes().without("last_block_at_finish"), strict=True)
        (continuation,) = record.continuations
        assert not continuation.eligible
        assert record.gpu_hit_tokens == 8  # A's positions 0-7: chunks 0 and 1

    @pytest.mark.parametrize("fixed", [True, False])
    def test_follow_up_finds_the_final_chunk_after_gpu_eviction(self, fixed):
        fixes = Fixes() if fixed else Fixes().without("last_block_at_finish")
        record = replay(two_turns(extra=[self.filler()]), self.CONFIG, fixes, strict=True)
        (continuation,) = (c for c in record.continuations if c.req_id == "C")
        assert continuation.eligible  # the filler evicted A's blocks from the GPU prefix cache
        assert continuation.served is fixed
        assert record.poisoned == [] and record.crash is None

    def test_sync_scheduling_stores_the_chunk_while_running(self):
        """Under sync scheduling the running watermark already reaches position 7."""
        record = replay(two_turns(), TINY, Fixes().without("last_block_at_finish"), strict=True, trace=True)
        assert stored_chunks(record, "A") == {0, 1}

    def test_eos_stop_is_scheduled_once_more_and_stores_it_anyway(self):
        record = replay(two_turns(stop="eos"), self.CONFIG, Fixes().without("last_block_at_finish"),
                        strict=True, trace=True)
        assert stored_chunks(record, "A") == {0, 1}


class TestFlushSubmitsBeforeWait:
    """A's freed final block is handed to B in the very schedule that builds A's final store."""

    CONFIG = TINY.replace(scheduling="async", max_num_batched_tokens=128)  # B's prompt in one step

    def requests(self):
        # B arrives right after A finishes (think time 0): it is admitted by the schedule whose
        # finished_req_ids holds A. A's blocks are cached (vLLM caches them at the finishing
        # output) and sit at the tail of the free queue; B's 30-block prompt reaches them.
        b = RequestSpec("B", tokens(9, 120), tokens(10, 2), parent="A", think_steps=0)
        return two_turns(extra=[b])

    def test_with_the_fix_the_final_store_copies_before_the_block_is_rewritten(self):
        record = replay(self.requests(), self.CONFIG, Fixes(), strict=True)
        assert record.poisoned == []
        assert record.fence_violations == []
        (continuation,) = record.continuations
        assert continuation.served

    def test_without_it_the_store_copies_the_new_owner_kv(self):
        record = replay(self.requests(), self.CONFIG, Fixes().without("flush_submits_before_wait"))
        assert [(p.req_id, p.chunk) for p in record.poisoned] == [("C", 1)]
        assert record.fence_violations and record.fence_violations[0].writer == "forward"
        assert record.unknown_wait_ids >= 1  # the fence waited on an id it had never seen


class TestDeferredFinishSignal:
    """The final store is built one schedule after request_finished (async: two)."""

    # Slow copies: chunk 0's store is still in flight when A finishes, so A's state survives
    # until the final store is built even with the old order.
    SLOW = TINY.replace(scheduling="async", store_completion_steps=4)

    def test_strict_manager_sees_no_call_after_the_finish_signal(self):
        record = replay(two_turns(), self.SLOW, Fixes(), strict=True)
        assert record.crash is None and record.lifecycle_violations == 0

    def test_old_order_crashes_a_strict_manager(self):
        record = replay(two_turns(), self.SLOW, Fixes().without("deferred_finish_signal"), strict=True)
        assert record.crash is not None and record.crash.startswith("LifecycleViolation")

    def test_old_order_is_counted_when_the_run_is_lenient(self):
        record = replay(two_turns(), self.SLOW, Fixes().without("deferred_finish_signal"))
        assert record.crash is None and record.lifecycle_violations == 1

    def test_old_cleanup_drops_the_final_store_when_the_last_job_lands_in_the_eos_step(self):
        """R2.3: with fast copies chunk 0's completion arrives with the finish; 0.26 forgot A."""
        config = TINY.replace(scheduling="async")
        fixed = replay(two_turns(), config, Fixes(), trace=True)
        broken = replay(two_turns(), config, Fixes().without("deferred_finish_signal"), trace=True)
        assert stored_chunks(fixed, "A") == {0, 1}
        assert stored_chunks(broken, "A") == {0}
        assert broken.lifecycle_violations == 0  # no crash: the chunk is silently lost


class TestFinalTokenWatermark:
    """R3.2: k=2 drafts; the last step accepts one and rejects one; the output ends at position 7."""

    CONFIG = TINY.replace(spec_tokens=2)

    def requests(self):
        a = RequestSpec("A", tokens(1, 5), tokens(2, 3), accept_counts=(1,))
        c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + tokens(3, 4), tokens(4, 2),
                        parent="A", think_steps=3)
        return [a, c]

    def test_rejected_draft_slot_is_never_published(self):
        record = replay(self.requests(), self.CONFIG, Fixes(), strict=True)
        assert record.poisoned == []

    def test_without_the_fix_the_next_turn_loads_the_rejected_draft(self):
        record = replay(self.requests(), self.CONFIG, Fixes().without("final_token_watermark"))
        assert [(p.req_id, p.chunk, p.bad_slots) for p in record.poisoned] == [("C", 1, 1)]

    def test_length_capped_sync_output_poisons_through_the_unwritten_slot(self):
        """No drafts: prompt 6 + 2 outputs = 8 tokens; slot 7 was never written at all."""
        record = replay(two_turns(first_output=2), TINY, Fixes().without("final_token_watermark"))
        assert [(p.req_id, p.chunk) for p in record.poisoned] == [("C", 1)]
        assert replay(two_turns(first_output=2), TINY, Fixes(), strict=True).poisoned == []


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_a_follow_up_finds_its_parents_decoded_blocks_in_the_gpu_prefix_cache(scheduling):
    """vLLM caches a running request's blocks as they fill, its decoded ones too
    (``KVCacheManager.allocate_slots`` -> ``cache_blocks``): A decodes 9 tokens after an 8-token
    prompt; positions 0-15 are written (the last sampled token's KV never is), 4 full blocks.
    C repeats A's whole history and arrives once A finished: its GPU prefix hit is those 16
    tokens, the connector's tier not needed."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 9))
    c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + tokens(3, 4), tokens(4, 2), parent="A",
                    think_steps=3)
    record = replay([a, c], TINY.replace(scheduling=scheduling), Fixes())
    assert (record.crash, record.finished_requests) == (None, 2)
    assert record.gpu_hit_tokens == 16


class TestRobustness:
    """Preemption, aborts and reset_cache with jobs in flight: no crash, no leak, no poison."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_preemption_with_stores_in_flight(self, scheduling):
        config = TINY.replace(gpu_blocks=14, scheduling=scheduling, store_completion_steps=3)
        requests = [RequestSpec(f"R{i}", tokens(i, 12), tokens(i + 50, 12), arrival_step=i) for i in range(4)]
        requests += [RequestSpec(f"F{i}", requests[i].prompt_token_ids + requests[i].output_token_ids,
                                 tokens(i + 90, 2), parent=f"R{i}", think_steps=2) for i in range(4)]
        record = replay(requests, config, Fixes(), strict=True)
        assert record.preemptions > 0
        assert (record.crash, record.poisoned, record.leaked_requests) == (None, [], ())
        assert record.finished_requests == 8

    def test_a_request_the_connector_never_releases_is_named_when_the_run_drains(self, monkeypatch):
        """The planted leak: the connector keeps B's state after B finished and its jobs ended.
        The run itself ends normally; the record names B, and only B, as leaked."""
        from kvoffload.core.scheduler import ReferenceConnectorScheduler

        release = ReferenceConnectorScheduler._release_if_done

        def keeps_b(self, state):
            if state.req.req_id != "B":
                release(self, state)

        monkeypatch.setattr(ReferenceConnectorScheduler, "_release_if_done", keeps_b)
        requests = [RequestSpec(name, tokens(i, 9), tokens(i + 20, 3), arrival_step=i) for i, name in enumerate("ABC")]
        record = replay(requests, TINY, Fixes())
        assert (record.crash, record.stuck_requests, record.finished_requests) == (None, (), 3)
        assert record.leaked_requests == ("B",)

    def test_only_a_run_that_drained_counts_leaks(self):
        """A leak is a request the connector still tracks after the run drained (the glossary's
        leaked_requests). A run that ends stuck or crashed has not drained: its stuck request,
        or whatever the crash left tracked, is reported as that, not as a leak."""
        padded_step_too_big = EngineConfig(gpu_blocks=8, block_size=2, blocks_per_chunk=1, spec_tokens=2,
                                           max_num_batched_tokens=2, max_num_seqs=1, scheduling="async")
        stuck = replay([RequestSpec(f"r{i}", (7, 7), (9,)) for i in range(2)], padded_step_too_big, Fixes())
        assert (stuck.crash, stuck.stuck_requests, stuck.leaked_requests) == (None, ("r1",), ())
        # PR #49146 and #49285 both undone: the queued abort's store walk is vLLM 0.26's assert
        queued_abort = [RequestSpec("R", tokens(1, 16), tokens(2, 4)),
                        RequestSpec("Q", tokens(3, 16), tokens(4, 4), abort_after_steps=1)]
        crashed = replay(queued_abort, TINY.replace(max_num_seqs=1),
                         Fixes().without("storable_within_allocated", "aborted_watermark"))
        assert crashed.crash.startswith("ConnectorCrash: assert len(offload_keys) == len(block_ids)")
        assert (crashed.stuck_requests, crashed.leaked_requests) == ((), ())

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_aborts_of_queued_and_prefilling_requests(self, scheduling):
        config = TINY.replace(scheduling=scheduling, max_num_batched_tokens=8, max_num_seqs=1)
        requests = [
            RequestSpec("long", tokens(1, 40), tokens(2, 4), abort_after_steps=2),  # aborted mid-prefill
            RequestSpec("queued", tokens(3, 8), tokens(4, 4), arrival_step=1, abort_after_steps=0),  # never scheduled
            RequestSpec("next", tokens(1, 40) + tokens(5, 4), tokens(6, 2), arrival_step=4),
        ]
        record = replay(requests, config, Fixes(), strict=True, trace=True)
        assert (record.crash, record.poisoned, record.leaked_requests) == (None, [], ())
        # Exactly the 16 tokens computed in its two steps (blocks are allocated only as far as
        # computed, so the allocated-block clamp holds this too; the next test isolates the
        # aborted watermark).
        assert stored_chunks(record, "long") == {0, 1, 2, 3}
        assert stored_chunks(record, "queued") == set()

    @pytest.mark.parametrize("fixed", [True, False])
    def test_abort_mid_prefill_stores_only_computed_tokens(self, fixed):
        """PR #49285: A has computed 6 of its 40 prompt tokens (blocks for positions 0-7) when it
        is aborted. Only chunk 0 is fully written: without the fix the watermark is the prompt
        and chunk 1 is stored with slots 6 and 7 never written; C, resending A's prompt, loads it."""
        config = TINY.replace(max_num_batched_tokens=6)
        a = RequestSpec("A", tokens(1, 40), tokens(2, 2), abort_after_steps=1)
        c = RequestSpec("C", a.prompt_token_ids + tokens(3, 4), tokens(4, 2), arrival_step=5)
        fixes = Fixes() if fixed else Fixes().without("aborted_watermark")
        record = replay([a, c], config, fixes, trace=True)
        assert stored_chunks(record, "A") == ({0} if fixed else {0, 1})
        assert [(p.req_id, p.chunk) for p in record.poisoned] == ([] if fixed else [("C", 1)])
        assert record.crash is None

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    def test_reset_cache_with_jobs_in_flight(self, scheduling):
        config = TINY.replace(scheduling=scheduling, store_completion_steps=4)
        requests = two_turns(first_prompt=16, first_output=6)
        record = replay(requests, config, Fixes(), reset_cache_at=[2, 3], strict=True)
        assert (record.crash, record.poisoned, record.leaked_requests, record.stuck_requests) == (None, [], (), ())

    def test_reset_without_clearing_request_jobs_dies_on_a_stale_job_id(self):
        config = TINY.replace(gpu_blocks=9, store_completion_steps=4)
        # R0 holds blocks; R1 is preempted with a store in flight; the reset drops that store.
        requests = [RequestSpec("R0", tokens(1, 16), tokens(2, 10)),
                    RequestSpec("R1", tokens(3, 8), tokens(4, 10))]
        fixed = replay(requests, config, Fixes(), reset_cache_at=[3])
        broken = replay(requests, config, Fixes().without("reset_clears_request_jobs"), reset_cache_at=[3])
        assert fixed.preemptions > 0
        assert (fixed.stuck_requests, fixed.leaked_requests) == ((), ())
        # vLLM 0.25: the surviving R0's next store looks its dropped job id up (KeyError)
        assert "KeyError" in str(broken.crash)


def test_a_pool_full_of_landed_loads_still_makes_progress():
    """Requests whose loads landed hold their blocks; a fresh request that cannot get blocks must
    not stop them from running (it did: seven requests stuck with 15 usable blocks)."""
    from kvoffload.workloads import load_workload

    workload = load_workload("shared-prefix-small", {"gpu_blocks": "16"})
    record = replay(workload.requests, workload.engine, Fixes(), strict=True)
    assert record.connector_stats["hit_tokens"] > 0
    assert (record.stuck_requests, record.crash, record.poisoned) == ((), None, [])
    assert record.finished_requests == len(workload.requests)
