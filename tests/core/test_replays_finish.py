"""Replays of the finish-path bugs (stories R1-R3 of docs/design.md), at scheduler level, fix on and fix off.

Setup "sync/bs4" unless said: one full-attention group, 4-token blocks, one block per chunk,
offload_prompt_only off, a strict lifecycle manager that raises on violations.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.core.manager import LifecycleViolation
from kvoffload.core.types import RequestStatus

EOS = 50256


def decline_until_finished(script_ref):
    """prepare_store answers None while the asking request is still running."""
    return lambda req_id, keys: not script_ref[0].requests[req_id].status.is_finished


def _finishing_request(script, fixes, *, prompt_len=4, decline=True):
    """A: prompt of ``prompt_len`` tokens, prefilled in step 0, samples EOS; returns the script."""
    ref = []
    s = script(fixes=fixes, decline=decline_until_finished(ref) if decline else None)
    ref.append(s)
    a = s.add("A", list(range(prompt_len)))
    s.admit(a, [1, 2])
    s.step(scheduled={"A": prompt_len}, new_blocks={"A": [1, 2]})
    s.sample("A", EOS)
    s.finish("A")
    return s


class TestLastBlockAtFinish:
    """PR #48596, scheduler half: the chunk completed last is stored from finished_req_ids."""

    def test_final_chunk_is_stored_by_the_finishing_step(self, script):
        s = _finishing_request(script, Fixes())
        # step 0 declined the store while A ran; step 1 walks finished_req_ids with watermark max(4, 5-1) = 4
        plan = s.step(finished=["A"])
        assert [job.chunk_indices for job in plan.store_jobs] == [(0,)]
        assert plan.store_jobs[0].gpu_block_ids == (1,)
        s.complete(plan.store_jobs[0].job_id)
        assert s.connector.tracked_request_ids() == ()

    def test_without_the_fix_the_final_chunk_is_never_offered(self, script):
        s = _finishing_request(script, Fixes().without("last_block_at_finish"))
        plan = s.step(finished=["A"])
        assert plan.store_jobs == ()
        assert s.stored_chunks.get("A", set()) == set()
        assert s.connector.tracked_request_ids() == ()

    def test_final_job_is_flushed_when_its_block_is_reused_in_the_same_step(self, script):
        """R1.2: B gets A's freed block X in the very schedule that builds A's final store."""
        s = _finishing_request(script, Fixes())
        b = s.add("B", [9, 9, 9, 9])
        s.admit(b, [1])
        plan = s.step(scheduled={"B": 4}, new_blocks={"B": [1]}, finished=["A"])
        (final_job,) = [job for job in plan.store_jobs if job.req_id == "A"]
        assert final_job.gpu_block_ids == (1,)
        assert final_job.job_id in plan.jobs_to_flush
        s.complete(final_job.job_id)
        assert s.connector.jobs.fenced_blocks == frozenset()
        assert "A" not in s.connector.tracked_request_ids()

    def test_in_flight_store_of_a_finished_request_is_fenced(self, script):
        """R1.3: A's store is still in flight when A finishes; B reuses the block -> flush."""
        s = script()
        a = s.add("A", [0, 0, 0, 0])
        s.admit(a, [1])
        plan = s.step(scheduled={"A": 4}, new_blocks={"A": [1]})
        (job,) = plan.store_jobs
        s.sample("A", EOS)
        s.finish("A")
        assert s.connector.jobs.fenced_blocks == {1}
        b = s.add("B", [1, 1, 1, 1])
        s.admit(b, [1])
        plan = s.step(scheduled={"B": 4}, new_blocks={"B": [1]}, finished=["A"])
        assert plan.jobs_to_flush == {job.job_id}
        s.complete(job.job_id)
        assert s.connector.jobs.fenced_blocks == frozenset()
        assert "A" not in s.connector.tracked_request_ids()

    def test_several_in_flight_stores_are_all_flushed(self, script):
        s = script()
        a = s.add("A", list(range(8)))
        s.admit(a, [1])
        first = s.step(scheduled={"A": 4}, new_blocks={"A": [1]})
        second = s.step(scheduled={"A": 4}, new_blocks={"A": [2]})
        s.sample("A", EOS)
        s.finish("A")
        b = s.add("B", [7] * 8)
        s.admit(b, [2, 1])
        plan = s.step(scheduled={"B": 8}, new_blocks={"B": [2, 1]}, finished=["A"])
        assert plan.jobs_to_flush == {first.store_jobs[0].job_id, second.store_jobs[0].job_id}


class TestDeferredFinishSignal:
    """Issue #49635 / PR #49671: on_request_finished only after the final store was built."""

    def test_final_prepare_store_precedes_the_finish_signal(self, script):
        s = _finishing_request(script, Fixes())
        plan = s.step(finished=["A"])
        a_calls = [call for call, req in s.manager.calls if req == "A"]
        assert a_calls == ["prepare_store", "declined", "prepare_store", "on_request_finished"]
        s.complete(plan.store_jobs[0].job_id)
        assert s.manager.violations == []

    def test_old_order_is_a_key_error_in_a_strict_manager(self, script):
        s = _finishing_request(script, Fixes().without("deferred_finish_signal"))
        with pytest.raises(LifecycleViolation, match="prepare_store for request 'A' after on_request_finished"):
            s.step(finished=["A"])

    def test_old_order_is_counted_when_not_raising(self, script):
        ref = []
        s = script(fixes=Fixes().without("deferred_finish_signal"), decline=decline_until_finished(ref),
                   raise_on_violation=False)
        ref.append(s)
        a = s.add("A", [0, 1, 2, 3])
        s.admit(a, [1])
        s.step(scheduled={"A": 4}, new_blocks={"A": [1]})
        s.sample("A", EOS)
        s.finish("A")
        s.step(finished=["A"])
        assert [(v.call, v.reason) for v in s.manager.violations] == [("prepare_store", "after on_request_finished")]

    def test_signal_is_not_deferred_until_store_completion(self, script):
        """R2.2: the hook fires once the last prepare_store is issued, before complete_store."""
        s = script(block_size=8, blocks_per_chunk=3)
        a = s.add("A", [0] * 24)
        s.admit(a, [1, 2, 3])
        plan = s.step(scheduled={"A": 24}, new_blocks={"A": [1, 2, 3]})
        (job,) = plan.store_jobs
        s.sample("A", EOS)
        s.finish("A")
        s.step(finished=["A"])
        assert [c for c, _ in s.manager.calls][-1] == "on_request_finished"
        s.complete(job.job_id)
        assert [c for c, _ in s.manager.calls][-1] == "complete_store"
        assert s.connector.tracked_request_ids() == ()

    @pytest.mark.parametrize("fixed", [True, False])
    def test_last_job_completing_in_the_eos_step_does_not_drop_the_final_store(self, script, fixed):
        """R2.3: chunk 0's store completes in the EOS step's output; chunk 1 must still be stored."""
        ref = []
        fixes = Fixes() if fixed else Fixes().without("deferred_finish_signal")
        s = script(fixes=fixes, raise_on_violation=False,
                   decline=lambda req_id, keys: (keys[0] != ref[0].requests[req_id].block_hashes[0]
                                                 and not ref[0].requests[req_id].status.is_finished))
        ref.append(s)
        a = s.add("A", list(range(6)))
        s.admit(a, [1, 2])
        plan = s.step(scheduled={"A": 6}, new_blocks={"A": [1, 2]})
        (job,) = plan.store_jobs
        assert job.chunk_indices == (0,)
        s.sample("A", 6)
        s.step(scheduled={"A": 1})
        s.sample("A", 7)
        s.step(scheduled={"A": 1})  # chunk 1 is full now: declined while A runs
        s.sample("A", EOS)
        s.finish("A")
        s.complete(job.job_id)  # update_connector_output of the EOS step
        plan = s.step(finished=["A"])
        if fixed:
            assert [j.chunk_indices for j in plan.store_jobs] == [(1,)]
        else:
            assert plan.store_jobs == ()
            assert s.stored_chunks["A"] == {0}

    def test_reset_cache_signals_a_finished_request_exactly_once(self, script):
        """R2.4: A finished with a store in flight; reset_cache before the next schedule."""
        s = script()
        a = s.add("A", [0, 1, 2, 3])
        s.admit(a, [1])
        s.step(scheduled={"A": 4}, new_blocks={"A": [1]})
        s.sample("A", EOS)
        s.finish("A")
        s.connector.reset_cache()
        assert s.manager.calls.count(("on_request_finished", "A")) == 1
        assert s.connector.tracked_request_ids() == ()
        plan = s.step(finished=["A"])
        assert s.manager.calls.count(("on_request_finished", "A")) == 1
        assert plan.jobs_to_flush  # the dropped job is still flushed before blocks are reused

    def test_allocation_failures_while_running_and_at_finish(self, script):
        s = script(decline=lambda req_id, keys: True)
        a = s.add("A", [0, 1, 2, 3])
        s.admit(a, [1])
        s.step(scheduled={"A": 4}, new_blocks={"A": [1]})
        s.sample("A", EOS)
        s.finish("A")
        s.step(finished=["A"])
        assert s.connector.stats.store_allocation_failures == 2
        assert s.connector.tracked_request_ids() == ()


class TestFinalTokenWatermark:
    """Issue #54193 / PR #54288: the final sampled token's slot is never written."""

    @pytest.mark.parametrize("fixed", [True, False])
    def test_final_token_does_not_complete_an_offloaded_chunk(self, script, fixed):
        """R3.1: prompt 7 + EOS = 8 tokens; slot 7 was never written by a forward pass."""
        fixes = Fixes() if fixed else Fixes().without("final_token_watermark")
        s = script(fixes=fixes)
        a = s.add("A", list(range(7)))
        s.admit(a, [1, 2])
        s.step(scheduled={"A": 7}, new_blocks={"A": [1, 2]})
        s.sample("A", EOS)
        s.finish("A")
        s.step(finished=["A"])
        assert s.stored_chunks["A"] == ({0} if fixed else {0, 1})

    @pytest.mark.parametrize("fixed", [True, False])
    def test_rejected_draft_slot_is_not_published(self, script, fixed):
        """R3.2: k=2 drafts; d6 accepted, d7 rejected, recovered token r7 = EOS at a chunk boundary."""
        fixes = Fixes() if fixed else Fixes().without("final_token_watermark")
        s = script(fixes=fixes)
        a = s.add("A", [10, 11, 12, 13, 14])
        s.admit(a, [1, 2])
        s.step(scheduled={"A": 5}, new_blocks={"A": [1, 2]})
        s.sample("A", 15)  # t5; drafts d6, d7 proposed
        s.step(scheduled={"A": 3})  # verify pass writes slots 5, 6, 7 (t5, d6, d7)
        a.num_computed_tokens -= 1  # d7 rejected
        s.sample("A", 16, EOS)  # d6 accepted, r7 = EOS at position 7
        assert (a.num_computed_tokens, a.num_tokens) == (7, 8)
        s.finish("A")
        s.step(finished=["A"])
        assert s.stored_chunks["A"] == ({0} if fixed else {0, 1})

    def test_prompt_only_offload_cannot_reach_the_final_token(self, script):
        """R3.4: with offload_prompt_only the watermark stops at the prompt."""
        s = script(fixes=Fixes().without("final_token_watermark"), offload_prompt_only=True)
        a = s.add("A", list(range(7)))
        s.admit(a, [1, 2])
        s.step(scheduled={"A": 7}, new_blocks={"A": [1, 2]})
        s.sample("A", EOS)
        s.finish("A")
        s.step(finished=["A"])
        assert s.stored_chunks["A"] == {0}


class TestAborts:
    @pytest.mark.parametrize("fixed", [True, False])
    def test_abort_mid_prefill_stores_only_computed_chunks(self, script, fixed):
        """R3.3: 8 of 12 prompt tokens computed when aborted."""
        fixes = Fixes() if fixed else Fixes().without("aborted_watermark")
        s = script(fixes=fixes)
        a = s.add("A", list(range(12)))
        s.admit(a, [1, 2, 3])
        s.step(scheduled={"A": 8}, new_blocks={"A": [1, 2, 3]})
        s.finish("A", status=RequestStatus.FINISHED_ABORTED)
        s.step(finished=["A"])
        assert s.stored_chunks["A"] == ({0, 1} if fixed else {0, 1, 2})

    def test_abort_of_a_queued_request_builds_nothing(self, script):
        s = script()
        s.add("A", list(range(12)))
        s.finish("A", status=RequestStatus.FINISHED_ABORTED)
        plan = s.step(finished=["A"])
        assert plan.store_jobs == ()
        assert s.connector.tracked_request_ids() == ()
        assert s.manager.violations == []

    def test_queued_abort_crashed_vllm_0_26(self, script):
        """#49118: no blocks, but keys -> assert len(offload_keys) == len(block_ids)."""
        from kvoffload.core.types import ConnectorCrash

        s = script(fixes=Fixes.preset("vllm-0.26"))
        s.add("A", list(range(12)))
        s.finish("A", status=RequestStatus.FINISHED_ABORTED)
        with pytest.raises(ConnectorCrash, match="len\\(offload_keys\\) == len\\(block_ids\\)"):
            s.step(finished=["A"])
