"""The worker side reports a failed load's GPU blocks (vLLM's worker-side
``get_block_ids_with_load_errors``; docs/engine.md, "Failed loads"): once, and only loads'."""

from __future__ import annotations

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import StepPlan, TransferKind
from kvoffload.worker import SteppedTransferHandler, WorkerConnector


def test_a_failed_loads_blocks_are_reported_once_and_a_failed_stores_never(kv, jobs):
    handler = SteppedTransferHandler(kv, completion_steps=0)
    worker = WorkerConnector(handler, Fixes())
    handler.fail_jobs(lambda job: True)
    load, store = jobs.load([4, 5], chunk_slots=[1, 2]), jobs.store([9], chunk_slots=[3])
    plan = StepPlan(load_jobs=(load,), store_jobs=(store,))
    worker.handle_preemptions(plan)
    worker.start_loads(plan)
    handler.run_submitted()
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(load.job_id, False)]
    assert worker.take_block_ids_with_load_errors() == {4, 5}
    assert worker.take_block_ids_with_load_errors() == set()  # taken: reported once
    worker.handle_preemptions(StepPlan())  # the store, deferred a step, copies and fails now
    worker.start_loads(StepPlan())
    handler.run_submitted()
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(store.job_id, False)]
    assert store.kind is TransferKind.STORE and worker.take_block_ids_with_load_errors() == set()
    assert worker.stats().failed_jobs == 2
