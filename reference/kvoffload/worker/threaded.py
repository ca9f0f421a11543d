"""A handler that really copies in the background on the CPU: one thread per direction.

Each direction has its own queue and thread, so stores stay in order among themselves, loads among
themselves, and a long store never delays a load. The copy reads its source whenever the thread
gets to it, which may be during the next forward: exactly the race a real GPU copy stream has.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Iterable

from kvoffload.core.types import BlockId, JobId, TransferJob, TransferKind, TransferResult
from kvoffload.worker.copy import BlockCopy, CpuBlockCopier
from kvoffload.worker.handler import HandlerStats, SubmissionLedger, result_of
from kvoffload.worker.kv import KVCache

log = logging.getLogger(__name__)

_STOP = None  # queue sentinel: the thread exits when it reads it


class ThreadedCopyHandler:
    def __init__(self, kv: KVCache) -> None:
        self.kv = kv
        self._ledger = SubmissionLedger(kv)  # submitting thread only
        self._copier = CpuBlockCopier(kv)
        self._done = threading.Condition()
        # Guarded by _done: jobs submitted and not yet copied (id -> plan), and completed results
        # not yet handed out by get_finished, in completion order.
        self._in_flight: dict[JobId, BlockCopy] = {}
        self._unreported: list[TransferResult] = []
        self._jobs_finished = 0
        self._queues: dict[TransferKind, queue.SimpleQueue[BlockCopy | None]] = {
            kind: queue.SimpleQueue() for kind in TransferKind
        }
        self._threads = [
            threading.Thread(
                target=self._copy_forever,
                args=(self._queues[kind],),
                name=f"kv-{kind.value}",
                daemon=True,
            )
            for kind in TransferKind
        ]
        for thread in self._threads:
            thread.start()

    def submit_store(self, job: TransferJob) -> None:
        self._submit(self._ledger.admit(job, TransferKind.STORE))

    def submit_load(self, job: TransferJob) -> None:
        self._submit(self._ledger.admit(job, TransferKind.LOAD))

    def get_finished(self) -> list[TransferResult]:
        with self._done:
            results, self._unreported = self._unreported, []
        self._jobs_finished += len(results)
        return results

    def wait(self, job_ids: Iterable[JobId]) -> None:
        """Block until every named submitted job was copied (unknown ids: ignored, counted)."""
        with self._done:
            targets = self._ledger.triage_wait(job_ids, self._in_flight)
            if targets:
                self._done.wait_for(lambda: targets.isdisjoint(self._in_flight))

    def wait_all(self) -> None:
        with self._done:
            self._done.wait_for(lambda: not self._in_flight)

    def pending_store_source_blocks(self) -> frozenset[BlockId]:
        """GPU blocks read by stores whose copy has not completed."""
        with self._done:
            plans = list(self._in_flight.values())
        return frozenset(block for plan in plans if plan.is_store for block in plan.gpu_rows)

    def stats(self) -> HandlerStats:
        return self._ledger.snapshot(self._jobs_finished)

    def shutdown(self) -> None:
        """Let both threads finish what was submitted, then stop them."""
        self._ledger.close()
        for kind in TransferKind:
            self._queues[kind].put(_STOP)
        for thread in self._threads:
            thread.join()

    def _submit(self, plan: BlockCopy) -> None:
        with self._done:
            self._in_flight[plan.job_id] = plan
        self._queues[plan.job.kind].put(plan)

    def _copy_forever(self, jobs: "queue.SimpleQueue[BlockCopy | None]") -> None:
        while (plan := jobs.get()) is not _STOP:
            start = time.perf_counter()
            try:
                self._copier.copy(plan)
                result = result_of(plan, time.perf_counter() - start)
            except Exception:  # reported as a failed job: the connector turns it into an error
                log.exception("copy of %s job %d failed", plan.job.kind.value, plan.job_id)
                result = TransferResult(job_id=plan.job_id, success=False)
            with self._done:
                del self._in_flight[plan.job_id]
                self._unreported.append(result)
                self._done.notify_all()


__all__ = ["ThreadedCopyHandler"]
