"""The threaded handler: real background copies, one FIFO thread per direction.

A gate in front of the copier lets a test hold a direction's thread mid-job, so "still in
flight" is a state the test controls rather than a race it hopes to win.
"""

from __future__ import annotations

import threading

import pytest
import torch

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import StepPlan
from kvoffload.worker import ThreadedCopyHandler, WorkerConnector


class GatedCopier:
    """Copies only while the gate is open; jobs of a held direction wait inside copy()."""

    def __init__(self, inner, hold_stores: bool = True, hold_loads: bool = False) -> None:
        self._inner = inner
        self._hold = {True: hold_stores, False: hold_loads}
        self.gate = threading.Event()

    def copy(self, plan) -> None:
        if self._hold[plan.is_store]:
            assert self.gate.wait(timeout=10), "test never opened the gate"
        self._inner.copy(plan)


@pytest.fixture
def handler(kv):
    handler = ThreadedCopyHandler(kv)
    yield handler
    gate = getattr(handler._copier, "gate", None)
    if gate is not None:
        gate.set()
    handler.shutdown()


def test_wait_blocks_until_the_named_store_has_copied(handler, kv, jobs, paint):
    """The fence really holds the caller: wait returns only after the bytes are in the tier."""
    handler._copier = gated = GatedCopier(handler._copier)
    original = paint(kv, 5, tag=1)
    store = jobs.store([5], chunk_slots=[3])
    handler.submit_store(store)

    waiter = threading.Thread(target=handler.wait, args=([store.job_id],))
    waiter.start()
    waiter.join(timeout=0.1)
    assert waiter.is_alive(), "wait returned while the copy was held"
    assert handler.pending_store_source_blocks() == frozenset({5})
    assert handler.get_finished() == []

    gated.gate.set()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert torch.equal(kv.tier_blocks[3], original)
    assert handler.pending_store_source_blocks() == frozenset()


def test_a_held_store_does_not_delay_a_load(handler, kv, jobs, paint):
    """Directions have their own thread: a load completes while an earlier store is still held."""
    handler._copier = GatedCopier(handler._copier)
    kv.tier_blocks[2].copy_(paint(kv, 0, tag=4))
    store = jobs.store([5], chunk_slots=[3])
    load = jobs.load([9], chunk_slots=[2])
    handler.submit_store(store)
    handler.submit_load(load)

    handler.wait([load.job_id])

    assert torch.equal(kv.gpu[9], kv.tier_blocks[2])
    assert [r.job_id for r in handler.get_finished()] == [load.job_id]


def test_results_of_one_direction_arrive_in_submission_order_with_bytes_and_seconds(
    handler, kv, jobs
):
    stores = [jobs.store([b], chunk_slots=[b]) for b in range(1, 9)]
    for store in stores:
        handler.submit_store(store)

    handler.wait_all()
    results = handler.get_finished()

    assert [r.job_id for r in results] == [s.job_id for s in stores]
    assert all(r.success and r.num_bytes == kv.block_bytes and r.seconds > 0 for r in results)


def test_unknown_ids_in_wait_return_at_once_and_are_counted(handler, jobs):
    """Same semantics as the stepped handler: ignored, counted, never blocking."""
    handler.wait([41, 42])
    store = jobs.store([1], chunk_slots=[0])
    handler.submit_store(store)
    handler.wait_all()
    handler.wait([store.job_id])

    assert handler.stats().unknown_wait_ids == 2
    assert handler.stats().already_done_wait_ids == 1


def test_a_failed_copy_is_passed_on_to_the_scheduler_side(kv, jobs):
    """A copy raising on the thread comes back as success=False; the worker reports it as it came
    (the scheduler recomputes a failed load, vLLM #52838) instead of taking the engine down."""

    class Broken:
        def copy(self, plan):
            raise RuntimeError("simulated DMA fault")

    handler = ThreadedCopyHandler(kv)
    handler._copier = Broken()
    worker = WorkerConnector(handler, Fixes())
    store = jobs.store([1], chunk_slots=[0])
    flushed = StepPlan(store_jobs=(store,), jobs_to_flush=frozenset({store.job_id}))

    worker.handle_preemptions(flushed)
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(store.job_id, False)]
    assert worker.stats().failed_jobs == 1 and worker.stats().stores.jobs == 0
    worker.shutdown()
