"""The contract every transfer handler keeps, and the bookkeeping they share.

A handler moves bytes for :class:`~kvoffload.core.types.TransferJob`s between the GPU blocks and
the offload tier of one :class:`~kvoffload.worker.kv.KVCache`:

- ``submit_store(job)`` / ``submit_load(job)`` validate the job (:class:`TransferJobError` on any
  bad id, size, kind or a job id seen before) and queue it. Jobs of one direction are copied and
  reported in submission order (FIFO per direction).
- ``get_finished()`` returns the jobs whose copy completed since the previous call, once each.
  A result with ``success=False`` is a copy that failed: its destination rows hold garbage. The
  scheduler side owns what follows (a failed store's keys never become visible; a failed load's
  blocks are recomputed, vLLM's ``get_block_ids_with_load_errors`` and
  ``Scheduler._handle_invalid_blocks``); the worker passes the report on and never raises.
- ``wait(job_ids)`` returns once every named job that was submitted has been copied. An id the
  handler was never given is ignored, as vLLM's worker does; that is what let the historical
  fence wait on a store that had not been submitted yet (vLLM PR #48596, worker half). Such ids
  are counted in ``stats().unknown_wait_ids`` so a run can show the fence was empty.
- ``wait_all()`` returns once every submitted job has been copied (a drain; counts nothing).
- ``pending_store_source_blocks()`` names the GPU blocks that submitted stores may still read:
  the engine must not overwrite one of them before the store's copy completed.
- ``shutdown()`` finishes what was submitted and refuses further submissions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Protocol

from kvoffload.core.types import BlockId, JobId, TransferJob, TransferKind, TransferResult
from kvoffload.worker.copy import BlockCopy, TransferJobError, plan_copy
from kvoffload.worker.kv import KVCache


class TransferHandler(Protocol):
    kv: KVCache

    def submit_store(self, job: TransferJob) -> None: ...
    def submit_load(self, job: TransferJob) -> None: ...
    def get_finished(self) -> list[TransferResult]: ...
    def wait(self, job_ids: Iterable[JobId]) -> None: ...
    def wait_all(self) -> None: ...
    def pending_store_source_blocks(self) -> frozenset[BlockId]: ...
    def stats(self) -> "HandlerStats": ...
    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class HandlerStats:
    """Counters of one handler since it was created (a snapshot; handlers keep the live ones)."""

    stores_submitted: int = 0
    loads_submitted: int = 0
    jobs_finished: int = 0  # reported by get_finished
    unknown_wait_ids: int = 0  # waited on, but never submitted to this handler
    already_done_wait_ids: int = 0  # waited on after their copy had completed


class SubmissionLedger:
    """Which job ids a handler accepted, and how the waits on ids went.

    Owned by one handler and touched only from the thread that submits and waits.
    """

    def __init__(self, kv: KVCache) -> None:
        self._kv = kv
        self._accepted: set[JobId] = set()
        self._closed = False
        self.stores_submitted = 0
        self.loads_submitted = 0
        self.unknown_wait_ids = 0
        self.already_done_wait_ids = 0

    def admit(self, job: TransferJob, kind: TransferKind) -> BlockCopy:
        """Validate and plan a submission; raise TransferJobError instead of queueing a bad job."""
        if self._closed:
            raise TransferJobError(f"{kind.value} job {job.job_id} submitted after shutdown")
        if job.job_id in self._accepted:
            raise TransferJobError(
                f"{job.kind.value} job {job.job_id} (request {job.req_id!r}) was already submitted"
            )
        plan = plan_copy(self._kv, job, kind)
        self._accepted.add(job.job_id)
        if kind is TransferKind.STORE:
            self.stores_submitted += 1
        else:
            self.loads_submitted += 1
        return plan

    def triage_wait(self, job_ids: Iterable[JobId], not_done: Collection[JobId]) -> set[JobId]:
        """The ids among ``job_ids`` still to wait for; count the ignored ones by reason."""
        targets: set[JobId] = set()
        for job_id in job_ids:
            if job_id in not_done:
                targets.add(job_id)
            elif job_id in self._accepted:
                self.already_done_wait_ids += 1
            else:
                self.unknown_wait_ids += 1
        return targets

    def close(self) -> None:
        self._closed = True

    def snapshot(self, jobs_finished: int) -> HandlerStats:
        return HandlerStats(
            stores_submitted=self.stores_submitted,
            loads_submitted=self.loads_submitted,
            jobs_finished=jobs_finished,
            unknown_wait_ids=self.unknown_wait_ids,
            already_done_wait_ids=self.already_done_wait_ids,
        )


def result_of(plan: BlockCopy, seconds: float) -> TransferResult:
    return TransferResult(
        job_id=plan.job_id, success=True, num_bytes=plan.num_bytes, seconds=seconds
    )


__all__ = ["HandlerStats", "SubmissionLedger", "TransferHandler", "TransferJobError", "result_of"]
