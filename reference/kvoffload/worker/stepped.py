"""The deterministic handler the simulated engine uses by default.

Submitting only records a job. Copies run at two points the engine names:

- ``run_submitted()``, which the engine calls right after each step's forward. A copy submitted in
  step N therefore reads its source *after* step N's forward wrote KV: the adversarial reading of
  "the copy runs concurrently with the forward". A block reused in step N without a fence is
  poisoned every time, not once in a thousand runs.
- ``wait(job_ids)``, which copies the named jobs at once, after every job of the same direction
  submitted before them (FIFO per direction).

Completion is reported ``completion_steps`` steps after the copy ran, where a step is one
``get_finished()`` call: with 0, by the ``get_finished`` of the step the copy ran in (the engine
calls it after ``run_submitted``); with 1, by the next one; and so on. Reports keep copy order.

Failure injection (``fail_jobs(predicate)``): a job the predicate names does not copy; its
destination rows are scribbled with ``FAILED_COPY_BYTE`` (a torn DMA, as a failed read from a
storage tier leaves it) and it is reported with ``success=False``. Whoever treats that report
as success serves the scribble, which the engine's content oracle sees (vLLM issues #39732,
#52838: a load failure must lead to recompute, not a crash and not garbage).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable

from kvoffload.core.types import (
    BlockId,
    ConfigError,
    JobId,
    TransferJob,
    TransferKind,
    TransferResult,
)
from kvoffload.worker.copy import BlockCopy, CpuBlockCopier
from kvoffload.worker.handler import HandlerStats, SubmissionLedger, result_of
from kvoffload.worker.kv import KVCache

# What a failed copy leaves in its destination rows. A slot's fingerprint is a 64-bit hash, so a
# scribbled slot passes the content oracle with probability 2**-64.
FAILED_COPY_BYTE = 0xA5


class SteppedTransferHandler:
    def __init__(self, kv: KVCache, completion_steps: int = 0) -> None:
        if type(completion_steps) is not int or completion_steps < 0:
            raise ConfigError(f"completion_steps must be an integer >= 0, got {completion_steps!r}")
        self.kv = kv
        self.completion_steps = completion_steps
        self._ledger = SubmissionLedger(kv)
        self._copier = CpuBlockCopier(kv)
        # job id -> plan, for jobs submitted but not copied yet; dict order is submission order
        self._not_copied: dict[JobId, BlockCopy] = {}
        # (get_finished call that reports it, result), in copy order
        self._copied_unreported: deque[tuple[int, TransferResult]] = deque()
        self._polls = 0  # get_finished calls so far: the index of the current step
        self._jobs_finished = 0
        self._fails: Callable[[TransferJob], bool] | None = None
        self.failed_job_ids: list[JobId] = []  # in copy order

    def fail_jobs(self, predicate: Callable[[TransferJob], bool] | None) -> None:
        """From now on, jobs for which ``predicate(job)`` is true fail when they copy (None: none)."""
        self._fails = predicate

    def submit_store(self, job: TransferJob) -> None:
        plan = self._ledger.admit(job, TransferKind.STORE)
        self._not_copied[plan.job_id] = plan

    def submit_load(self, job: TransferJob) -> None:
        plan = self._ledger.admit(job, TransferKind.LOAD)
        self._not_copied[plan.job_id] = plan

    def run_submitted(self) -> None:
        """Copy every submitted job now, in submission order (the engine: after the forward)."""
        if self._not_copied:
            self._copy(list(self._not_copied.values()))

    def wait(self, job_ids: Iterable[JobId]) -> None:
        """Copy the named submitted jobs now, each after the earlier jobs of its direction.

        Ids never submitted, or already copied, are ignored (and counted in ``stats()``).
        """
        targets = self._ledger.triage_wait(job_ids, self._not_copied)
        if not targets:
            return
        queued = list(self._not_copied.values())
        last_store = last_load = -1
        for position, plan in enumerate(queued):
            if plan.job_id in targets:
                if plan.is_store:
                    last_store = position
                else:
                    last_load = position
        self._copy(
            [
                plan
                for position, plan in enumerate(queued)
                if position <= (last_store if plan.is_store else last_load)
            ]
        )

    def wait_all(self) -> None:
        self.run_submitted()

    def get_finished(self) -> list[TransferResult]:
        """Jobs whose completion falls due in this step; each call ends one step."""
        due = self._polls
        self._polls += 1
        copied = self._copied_unreported
        if not copied or copied[0][0] > due:
            return []
        results = []
        while copied and copied[0][0] <= due:
            results.append(copied.popleft()[1])
        self._jobs_finished += len(results)
        return results

    def pending_store_source_blocks(self) -> frozenset[BlockId]:
        """GPU blocks read by stores that were submitted but not copied yet."""
        return frozenset(
            block for plan in self._not_copied.values() if plan.is_store for block in plan.gpu_rows
        )

    def pending_store_job_ids(self) -> tuple[JobId, ...]:
        """Stores submitted but not copied yet, in submission order."""
        return tuple(job_id for job_id, plan in self._not_copied.items() if plan.is_store)

    def stats(self) -> HandlerStats:
        return self._ledger.snapshot(self._jobs_finished)

    def shutdown(self) -> None:
        """Copy what was submitted (as a device synchronize would) and refuse new submissions."""
        self.wait_all()
        self._ledger.close()

    def _copy(self, plans: list[BlockCopy]) -> None:
        report_at = self._polls + self.completion_steps
        fails = self._fails
        for plan in plans:
            del self._not_copied[plan.job_id]
            if fails is not None and fails(plan.job):
                self._scribble(plan)
                self.failed_job_ids.append(plan.job_id)
                self._copied_unreported.append((report_at, TransferResult(plan.job_id, success=False)))
                continue
            start = time.perf_counter()
            self._copier.copy(plan)
            seconds = time.perf_counter() - start
            self._copied_unreported.append((report_at, result_of(plan, seconds)))

    def _scribble(self, plan: BlockCopy) -> None:
        """A failed copy's destination: every row it would have written holds FAILED_COPY_BYTE."""
        if plan.is_store:
            self.kv.tier_blocks[list(plan.tier_rows)] = FAILED_COPY_BYTE
        else:
            self.kv.gpu[list(plan.gpu_rows)] = FAILED_COPY_BYTE


__all__ = ["FAILED_COPY_BYTE", "SteppedTransferHandler"]
