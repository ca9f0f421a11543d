"""The connector's worker side: when each step's jobs reach the transfer handler.

Per engine step (vLLM's order, docs/engine.md "One engine step")::

    handle_preemptions(plan)  submit the deferred stores, then wait(plan.jobs_to_flush)   [fence]
    start_loads(plan)         submit every load of the plan
    -- forward --
    get_finished()            queue the plan's other stores for the next step; poll completions

Stores are deferred one step so that they start after the transfers of token sampling. A store
that must not wait (its source blocks are reused in this very step) is named in
``jobs_to_flush``. With ``Fixes.flush_submits_before_wait`` the flushed stores of the current
plan join the queue before it is submitted, so ``wait`` really covers them. Without it (vLLM up
to 0.25) they are still unsubmitted when ``wait`` runs, the handler ignores their ids, and the
copy happens a step later from blocks that a new owner has overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import BlockId, JobId, StepPlan, TransferJob, TransferKind, TransferResult
from kvoffload.worker.handler import TransferHandler


@dataclass(frozen=True)
class DirectionTotals:
    """Completed jobs of one direction, as reported by the handler."""

    jobs: int = 0
    num_bytes: int = 0
    seconds: float = 0.0

    def plus(self, result: TransferResult) -> "DirectionTotals":
        return DirectionTotals(
            self.jobs + 1, self.num_bytes + result.num_bytes, self.seconds + result.seconds
        )


@dataclass(frozen=True)
class WorkerStats:
    stores: DirectionTotals = DirectionTotals()
    loads: DirectionTotals = DirectionTotals()
    failed_jobs: int = 0  # reported with success=False (passed on to the scheduler side)


class WorkerConnector:
    def __init__(self, handler: TransferHandler, fixes: Fixes | None = None,
                 on_store_submitted: Callable[[TransferJob], None] | None = None) -> None:
        self.handler = handler
        self.fixes = fixes if fixes is not None else Fixes()
        self._on_store_submitted = on_store_submitted  # the engine's observer: store delays
        self._unsubmitted_stores: list[TransferJob] = []  # the only queue of deferred stores
        self._current_plan: StepPlan | None = None  # from handle_preemptions until get_finished
        self._stores_to_defer: tuple[TransferJob, ...] = ()  # its stores get_finished will queue
        self._submitted: dict[JobId, TransferJob] = {}  # until reported finished
        # GPU blocks of loads reported failed, until the engine takes them (vLLM's worker-side
        # get_block_ids_with_load_errors, kv_connector/v1/base.py). The worker owns this report:
        # it knows every load it copied, whatever the scheduler side forgot since (a reset_cache
        # makes the load's completion stale there, not its blocks any less garbage).
        self._load_error_blocks: set[BlockId] = set()
        self._stats = WorkerStats()

    def handle_preemptions(self, plan: StepPlan) -> None:
        """Submit the deferred stores (and, with the fix, this plan's flushed ones), then fence."""
        self._begin_step(plan)
        if self.fixes.flush_submits_before_wait and plan.jobs_to_flush:
            flushed = [job for job in plan.store_jobs if job.job_id in plan.jobs_to_flush]
            self._unsubmitted_stores.extend(flushed)
            self._stores_to_defer = tuple(
                j for j in plan.store_jobs if j.job_id not in plan.jobs_to_flush
            )
        self._submit_queued_stores()
        if plan.jobs_to_flush:
            self.handler.wait(plan.jobs_to_flush)

    def start_loads(self, plan: StepPlan) -> None:
        """Submit any stores still queued (normally none), then every load of the plan."""
        if plan is not self._current_plan:
            self._begin_step(plan)
        self._submit_queued_stores()
        for job in plan.load_jobs:
            self.handler.submit_load(job)
            self._submitted[job.job_id] = job

    def get_finished(self) -> list[TransferResult]:
        """Queue this step's remaining stores for the next step, then report completed jobs.

        Failed copies are reported as they came (``success=False``), never raised: vLLM's worker
        asserted success and took the engine down instead of letting the scheduler recompute
        (issues #39732, #52838).
        """
        self._unsubmitted_stores.extend(self._stores_to_defer)
        self._current_plan, self._stores_to_defer = None, ()
        results = self.handler.get_finished()
        for result in results:
            job = self._submitted.pop(result.job_id, None)
            kind = job.kind if job is not None else None
            stats = self._stats
            if not result.success:
                if kind is TransferKind.LOAD:
                    self._load_error_blocks.update(job.gpu_block_ids)
                self._stats = WorkerStats(stats.stores, stats.loads, stats.failed_jobs + 1)
            elif kind is TransferKind.STORE:
                self._stats = WorkerStats(stats.stores.plus(result), stats.loads, stats.failed_jobs)
            elif kind is TransferKind.LOAD:
                self._stats = WorkerStats(stats.stores, stats.loads.plus(result), stats.failed_jobs)
        return results

    def take_block_ids_with_load_errors(self) -> set[BlockId]:
        """GPU blocks of loads reported failed since the last call (each reported once): the
        engine recomputes from the first of them (vLLM ``Scheduler._handle_invalid_blocks``)."""
        blocks, self._load_error_blocks = self._load_error_blocks, set()
        return blocks

    def unsubmitted_store_source_blocks(self) -> frozenset[BlockId]:
        """GPU blocks read by stores queued here and not yet handed to the handler."""
        return frozenset(block for job in self._unsubmitted_stores for block in job.gpu_block_ids)

    def pending_store_source_blocks(self) -> frozenset[BlockId]:
        """GPU blocks any not-yet-copied store will read: queued here or pending in the handler.

        The engine's fence check: none of these may be overwritten before its store has copied.
        """
        return self.unsubmitted_store_source_blocks() | self.handler.pending_store_source_blocks()

    def has_unsubmitted_stores(self) -> bool:
        return bool(self._unsubmitted_stores)

    def stats(self) -> WorkerStats:
        return self._stats

    def shutdown(self) -> None:
        """Submit what is still queued, let the handler finish it, and stop the handler."""
        self._submit_queued_stores()
        self.handler.shutdown()

    def _begin_step(self, plan: StepPlan) -> None:
        self._current_plan = plan
        self._stores_to_defer = plan.store_jobs

    def _submit_queued_stores(self) -> None:
        if not self._unsubmitted_stores:
            return
        queued, self._unsubmitted_stores = self._unsubmitted_stores, []
        for job in queued:
            self.handler.submit_store(job)
            self._submitted[job.job_id] = job
            if self._on_store_submitted is not None:
                self._on_store_submitted(job)


__all__ = ["DirectionTotals", "WorkerConnector", "WorkerStats"]
