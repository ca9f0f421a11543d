"""The stepped handler: copies run where the engine says, completions arrive when configured.

The engine's step, as these tests play it: submit (handle_preemptions / start_loads), forward
(writes KV), run_submitted(), get_finished().
"""

from __future__ import annotations

import pytest
import torch

from kvoffload.core.types import ConfigError
from kvoffload.worker import SteppedTransferHandler, TransferJobError


def test_a_store_copies_what_the_forward_wrote_after_its_submission(kv, jobs, paint):
    """Adversarial default: the source is overwritten before run_submitted; the tier gets that."""
    handler = SteppedTransferHandler(kv)
    paint(kv, 5, tag=1)  # the finished request's KV
    handler.submit_store(jobs.store([5], chunk_slots=[3]))

    assert not kv.tier_blocks[3].any(), "submitting must not copy"
    new_owner = paint(kv, 5, tag=2)  # the forward of the block's new owner
    handler.run_submitted()

    assert torch.equal(kv.tier_blocks[3], new_owner)


def test_waiting_before_the_overwrite_keeps_the_old_bytes(kv, jobs, paint):
    """wait() is the fence: the copy runs at once, so the later forward cannot poison it."""
    handler = SteppedTransferHandler(kv)
    original = paint(kv, 5, tag=1)
    store = jobs.store([5], chunk_slots=[3])
    handler.submit_store(store)

    handler.wait([store.job_id])
    paint(kv, 5, tag=2)
    handler.run_submitted()

    assert torch.equal(kv.tier_blocks[3], original)
    assert handler.pending_store_source_blocks() == frozenset()


def test_wait_copies_earlier_jobs_of_the_same_direction_first_and_nothing_later(kv, jobs, paint):
    """FIFO per direction: waiting on store 2 copies store 1 too, but neither store 3 nor a load."""
    handler = SteppedTransferHandler(kv)
    for block in (1, 2, 3):
        paint(kv, block, tag=block)
    first, second, third = (jobs.store([b], chunk_slots=[b]) for b in (1, 2, 3))
    load = jobs.load([9], chunk_slots=[0])
    handler.submit_store(first)
    handler.submit_load(load)
    handler.submit_store(second)
    handler.submit_store(third)

    handler.wait([second.job_id])

    assert kv.tier_blocks[1].any() and kv.tier_blocks[2].any()
    assert not kv.tier_blocks[3].any()
    assert handler.pending_store_source_blocks() == frozenset({3})
    assert [r.job_id for r in handler.get_finished()] == [first.job_id, second.job_id]
    handler.run_submitted()
    assert [r.job_id for r in handler.get_finished()] == [load.job_id, third.job_id]


@pytest.mark.parametrize("completion_steps", [0, 1, 2])
def test_completion_is_reported_the_configured_number_of_steps_after_the_copy(
    kv, jobs, completion_steps
):
    """Step k copies; get_finished of step k + completion_steps reports it, and only that one."""
    handler = SteppedTransferHandler(kv, completion_steps=completion_steps)
    assert handler.get_finished() == []  # step 0: nothing submitted
    store = jobs.store([4], chunk_slots=[2])
    handler.submit_store(store)  # step 1: submitted, copied after the forward
    handler.run_submitted()

    reports_by_step = [handler.get_finished()]
    for _ in range(3):  # steps 2, 3, 4: nothing new
        handler.run_submitted()
        reports_by_step.append(handler.get_finished())

    assert [[r.job_id for r in reports] for reports in reports_by_step] == [
        [store.job_id] if step == completion_steps else [] for step in range(4)
    ]


def test_a_copy_forced_by_wait_counts_its_delay_from_the_step_it_ran_in(kv, jobs):
    """Submitted in step 0, copied by a wait in step 1: one step of delay reports it in step 2."""
    handler = SteppedTransferHandler(kv, completion_steps=1)
    store = jobs.store([4], chunk_slots=[2])
    handler.submit_store(store)
    handler.get_finished()  # step 0 ends without run_submitted

    handler.wait([store.job_id])  # step 1
    assert handler.get_finished() == []
    assert [r.job_id for r in handler.get_finished()] == [store.job_id]  # step 2


def test_waiting_on_unknown_or_finished_ids_is_ignored_and_counted(kv, jobs, paint):
    """vLLM's wait ignores ids it never saw; so do we, but we count them: an empty fence shows."""
    handler = SteppedTransferHandler(kv)
    paint(kv, 5, tag=1)
    store = jobs.store([5], chunk_slots=[3])
    never_submitted = jobs.store([6], chunk_slots=[4])

    handler.wait([never_submitted.job_id, 999])
    handler.submit_store(store)
    handler.run_submitted()
    handler.wait([store.job_id])

    stats = handler.stats()
    assert stats.unknown_wait_ids == 2
    assert stats.already_done_wait_ids == 1
    assert not kv.tier_blocks[4].any(), "an unknown id must not copy anything"


def test_pending_store_sources_cover_submitted_stores_until_they_copy(kv, jobs):
    """The engine's fence check reads these: blocks that must not be overwritten yet."""
    handler = SteppedTransferHandler(kv)
    handler.submit_store(jobs.store([1, 2], chunk_slots=[0, 1]))
    handler.submit_load(jobs.load([7], chunk_slots=[5]))

    assert handler.pending_store_source_blocks() == frozenset({1, 2})
    handler.run_submitted()
    assert handler.pending_store_source_blocks() == frozenset()


def test_shutdown_copies_what_was_submitted_and_refuses_more(kv, jobs, paint):
    """Shutdown drains like a device synchronize; a later submission is an error, not dropped."""
    handler = SteppedTransferHandler(kv)
    original = paint(kv, 5, tag=1)
    handler.submit_store(jobs.store([5], chunk_slots=[3]))

    handler.shutdown()

    assert torch.equal(kv.tier_blocks[3], original)
    with pytest.raises(TransferJobError, match="after shutdown"):
        handler.submit_store(jobs.store([6], chunk_slots=[4]))


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_completion_steps_must_be_a_non_negative_integer(kv, bad):
    with pytest.raises(ConfigError, match="completion_steps"):
        SteppedTransferHandler(kv, completion_steps=bad)
