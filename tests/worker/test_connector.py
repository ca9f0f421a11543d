"""The connector's worker side over the stepped handler: deferral, the fence, and its history.

Each test plays engine steps in vLLM's order: handle_preemptions(plan), start_loads(plan),
forward (here: paint a block), run_submitted(), get_finished().
"""

from __future__ import annotations

import pytest
import torch

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import StepPlan
from kvoffload.worker import SteppedTransferHandler, WorkerConnector


def _worker(kv, fixes: Fixes | None = None, completion_steps: int = 0):
    handler = SteppedTransferHandler(kv, completion_steps=completion_steps)
    return WorkerConnector(handler, fixes or Fixes()), handler


def _step(worker, handler, plan: StepPlan, forward=lambda: None):
    worker.handle_preemptions(plan)
    worker.start_loads(plan)
    forward()
    handler.run_submitted()
    return worker.get_finished()


def test_stores_are_submitted_at_the_start_of_the_next_step(kv, jobs, paint):
    """A store built in step N: queued by get_finished(N), submitted by handle_preemptions(N+1)."""
    worker, handler = _worker(kv)
    paint(kv, 5, tag=1)
    store = jobs.store([5], chunk_slots=[3])

    _step(worker, handler, StepPlan(store_jobs=(store,)))
    assert not kv.tier_blocks[3].any(), "copied in the step it was built in"
    assert worker.unsubmitted_store_source_blocks() == frozenset({5})
    assert worker.pending_store_source_blocks() == frozenset({5})

    worker.handle_preemptions(StepPlan())
    assert worker.unsubmitted_store_source_blocks() == frozenset()
    assert handler.pending_store_source_blocks() == frozenset({5})
    worker.start_loads(StepPlan())
    handler.run_submitted()
    assert [r.job_id for r in worker.get_finished()] == [store.job_id]
    assert kv.tier_blocks[3].any()


def test_loads_are_submitted_in_start_loads_of_the_same_step(kv, jobs, paint):
    worker, handler = _worker(kv)
    kv.tier_blocks[2].copy_(paint(kv, 0, tag=3))
    load = jobs.load([8], chunk_slots=[2])

    results = _step(worker, handler, StepPlan(load_jobs=(load,)))

    assert [r.job_id for r in results] == [load.job_id]
    assert torch.equal(kv.gpu[8], kv.tier_blocks[2])


def test_with_the_fix_a_flushed_store_of_this_plan_copies_before_handle_preemptions_returns(
    kv, jobs, paint
):
    """flush_submits_before_wait on: the final store is submitted, then waited on: the fence holds.

    Scenario: request R finished; its last block 5 goes back to the free queue's head; the very
    schedule that builds R's final store hands block 5 to request S, so the plan flushes the store.
    """
    worker, handler = _worker(kv, Fixes())
    r_kv = paint(kv, 5, tag=1)
    final_store = jobs.store([5], chunk_slots=[3], req_id="R")
    plan = StepPlan(store_jobs=(final_store,), jobs_to_flush=frozenset({final_store.job_id}))

    worker.handle_preemptions(plan)

    assert torch.equal(kv.tier_blocks[3], r_kv), "the copy must be complete when the fence returns"
    assert worker.pending_store_source_blocks() == frozenset()
    worker.start_loads(plan)
    paint(kv, 5, tag=2)  # S's forward writes block 5
    handler.run_submitted()
    assert [r.job_id for r in worker.get_finished()] == [final_store.job_id]
    assert torch.equal(kv.tier_blocks[3], r_kv)
    assert handler.stats().unknown_wait_ids == 0
    assert not worker.has_unsubmitted_stores(), "a flushed store must not be queued a second time"


def test_without_the_fix_the_fence_waits_on_nothing_and_the_late_copy_stores_the_new_owners_kv(
    kv, jobs, paint
):
    """vLLM <= 0.25 (PR #48596 worker half): wait() ran before the flushed store was submitted.

    Same scenario; the store is deferred like any other, so it copies block 5 a step later, after
    S's forward overwrote it: R's chunk in the tier now holds S's KV (a poisoned chunk).
    """
    worker, handler = _worker(kv, Fixes().without("flush_submits_before_wait"))
    paint(kv, 5, tag=1)
    final_store = jobs.store([5], chunk_slots=[3], req_id="R")
    plan = StepPlan(store_jobs=(final_store,), jobs_to_flush=frozenset({final_store.job_id}))

    worker.handle_preemptions(plan)
    assert not kv.tier_blocks[3].any(), "nothing may be copied yet"
    assert handler.stats().unknown_wait_ids == 1, "the fence waited on an id never submitted"
    assert worker.pending_store_source_blocks() == frozenset(), "the store is not even queued yet"

    worker.start_loads(plan)
    s_kv = paint(kv, 5, tag=2)  # S's forward
    handler.run_submitted()
    worker.get_finished()
    assert worker.unsubmitted_store_source_blocks() == frozenset({5})

    _step(worker, handler, StepPlan())
    assert torch.equal(kv.tier_blocks[3], s_kv)


def test_with_the_fix_previous_steps_stores_and_this_plans_flushed_store_all_copy_in_order(
    kv, jobs, paint
):
    """The fence covers the deferred queue plus this plan's flushed jobs; the rest wait a step."""
    worker, handler = _worker(kv)
    for block in (1, 2, 3):
        paint(kv, block, tag=block)
    earlier = jobs.store([1], chunk_slots=[1])
    _step(worker, handler, StepPlan(store_jobs=(earlier,)))
    flushed = jobs.store([2], chunk_slots=[2])
    ordinary = jobs.store([3], chunk_slots=[3])
    plan = StepPlan(
        store_jobs=(flushed, ordinary), jobs_to_flush=frozenset({earlier.job_id, flushed.job_id})
    )

    worker.handle_preemptions(plan)

    assert kv.tier_blocks[1].any() and kv.tier_blocks[2].any()
    assert not kv.tier_blocks[3].any()
    worker.start_loads(plan)
    handler.run_submitted()
    assert [r.job_id for r in worker.get_finished()] == [earlier.job_id, flushed.job_id]
    assert worker.unsubmitted_store_source_blocks() == frozenset({3})


def test_statistics_add_up_per_direction(kv, jobs, paint):
    worker, handler = _worker(kv)
    store = jobs.store([1, 2], chunk_slots=[1, 2])
    load = jobs.load([7], chunk_slots=[1])
    _step(worker, handler, StepPlan(store_jobs=(store,)))
    _step(worker, handler, StepPlan())
    _step(worker, handler, StepPlan(load_jobs=(load,)))

    stats = worker.stats()
    assert (stats.stores.jobs, stats.stores.num_bytes) == (1, 2 * kv.block_bytes)
    assert (stats.loads.jobs, stats.loads.num_bytes) == (1, kv.block_bytes)
    assert stats.stores.seconds > 0 and stats.loads.seconds > 0


def test_shutdown_submits_and_copies_the_deferred_queue(kv, jobs, paint):
    """Stores queued for a next step that never comes are still copied at shutdown."""
    worker, handler = _worker(kv)
    original = paint(kv, 4, tag=9)
    _step(worker, handler, StepPlan(store_jobs=(jobs.store([4], chunk_slots=[0]),)))

    worker.shutdown()

    assert torch.equal(kv.tier_blocks[0], original)
    assert not worker.has_unsubmitted_stores()


@pytest.mark.parametrize("completion_steps", [0, 2])
def test_a_multi_step_run_moves_every_byte_once(kv_factory, jobs, paint, completion_steps):
    """Many steps of stores, flushes and loads: every stored chunk loads back exactly."""
    kv = kv_factory(blocks_per_chunk=2)
    worker, handler = _worker(kv, completion_steps=completion_steps)
    stored = {}
    reported = []
    for step in range(6):
        blocks = [2 * step + 1, 2 * step + 2]
        originals = [paint(kv, b, tag=100 + b) for b in blocks]
        store = jobs.store(blocks, chunk_slots=[step])
        stored[step] = originals
        flush = frozenset({store.job_id}) if step % 2 else frozenset()
        reported += _step(worker, handler, StepPlan(store_jobs=(store,), jobs_to_flush=flush))
    worker.handle_preemptions(StepPlan())
    loads = [
        jobs.load([20 + 2 * s, 21 + 2 * s][1:], chunk_slots=[s], skip_blocks=1) for s in range(6)
    ]
    worker.start_loads(StepPlan(load_jobs=tuple(loads)))
    handler.run_submitted()
    for _ in range(completion_steps + 1):
        reported += worker.get_finished()

    assert len(reported) == 12 and len({r.job_id for r in reported}) == 12
    for s in range(6):
        assert torch.equal(kv.gpu[21 + 2 * s], stored[s][1])
