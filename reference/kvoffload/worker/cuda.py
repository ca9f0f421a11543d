"""A handler that copies between CUDA blocks and the pinned host tier on side streams.

Ordering, per transfer (each gets a stream from a small pool and a start and end event):

1. The transfer stream waits for the compute stream as it is at submission. A store then reads
   KV written by every kernel queued before it, even ones still running (read-after-write; bug
   catalogue K12, vLLM #31341). A load likewise cannot overwrite a block that an earlier kernel
   still reads (write-after-read, K12 / vLLM #47282), which vLLM's own load path does not order.
2. It waits for the end event of the previous transfer of its direction: FIFO per direction.
3. start event, one asynchronous copy per run of consecutive rows, end event.

``get_finished`` polls end events from the head of each direction's FIFO; ``wait`` blocks the
host on the end events of the named jobs. Seconds come from the event pair (device time).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

import torch

from kvoffload.core.types import (
    BlockId,
    ConfigError,
    JobId,
    TransferJob,
    TransferKind,
    TransferResult,
)
from kvoffload.worker.copy import BlockCopy
from kvoffload.worker.handler import HandlerStats, SubmissionLedger
from kvoffload.worker.kv import KVCache


@dataclass(frozen=True, slots=True)
class _Transfer:
    plan: BlockCopy
    stream: torch.cuda.Stream
    start: torch.cuda.Event
    end: torch.cuda.Event


class CudaTransferHandler:
    def __init__(self, kv: KVCache) -> None:
        if not kv.is_cuda:
            raise ConfigError(
                f"CudaTransferHandler needs a KVCache on a CUDA device, got {kv.device}"
            )
        if not kv.cpu.is_pinned():
            raise ConfigError("CudaTransferHandler needs a pinned host tier")
        self.kv = kv
        self._ledger = SubmissionLedger(kv)
        self._idle_streams: list[torch.cuda.Stream] = []
        # per direction, transfers not yet reported, in submission (= completion) order
        self._in_flight: dict[TransferKind, deque[_Transfer]] = {
            kind: deque() for kind in TransferKind
        }
        self._by_job: dict[JobId, _Transfer] = {}
        self._jobs_finished = 0

    def submit_store(self, job: TransferJob) -> None:
        self._submit(self._ledger.admit(job, TransferKind.STORE))

    def submit_load(self, job: TransferJob) -> None:
        self._submit(self._ledger.admit(job, TransferKind.LOAD))

    def get_finished(self) -> list[TransferResult]:
        results = []
        for fifo in self._in_flight.values():
            while fifo and fifo[0].end.query():
                results.append(self._retire(fifo.popleft()))
        self._jobs_finished += len(results)
        return results

    def wait(self, job_ids: Iterable[JobId]) -> None:
        """Block the host until the named submitted jobs completed (unknown ids: ignored, counted).

        Done jobs stay queued for ``get_finished``, which reports them in order.
        """
        targets = self._ledger.triage_wait(job_ids, self._not_completed())
        for job_id in targets:
            self._by_job[job_id].end.synchronize()

    def wait_all(self) -> None:
        for fifo in self._in_flight.values():
            if fifo:
                fifo[-1].end.synchronize()

    def pending_store_source_blocks(self) -> frozenset[BlockId]:
        """GPU blocks read by stores whose completion was not reported yet (a safe superset)."""
        return frozenset(
            block for t in self._in_flight[TransferKind.STORE] for block in t.plan.gpu_rows
        )

    def stats(self) -> HandlerStats:
        return self._ledger.snapshot(self._jobs_finished)

    def shutdown(self) -> None:
        self._ledger.close()
        self.wait_all()

    def _not_completed(self) -> set[JobId]:
        return {job_id for job_id, transfer in self._by_job.items() if not transfer.end.query()}

    def _submit(self, plan: BlockCopy) -> None:
        device = self.kv.device
        stream = (
            self._idle_streams.pop() if self._idle_streams else torch.cuda.Stream(device=device)
        )
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        stream.wait_stream(torch.cuda.current_stream(device))
        fifo = self._in_flight[plan.job.kind]
        if fifo:
            stream.wait_event(fifo[-1].end)
        gpu, tier = self.kv.gpu, self.kv.tier_blocks
        with torch.cuda.stream(stream):
            start.record(stream)
            if plan.is_store:
                for g, t, n in plan.runs:
                    tier[t : t + n].copy_(gpu[g : g + n], non_blocking=True)
            else:
                for g, t, n in plan.runs:
                    gpu[g : g + n].copy_(tier[t : t + n], non_blocking=True)
            end.record(stream)
        transfer = _Transfer(plan=plan, stream=stream, start=start, end=end)
        fifo.append(transfer)
        self._by_job[plan.job_id] = transfer

    def _retire(self, transfer: _Transfer) -> TransferResult:
        del self._by_job[transfer.plan.job_id]
        self._idle_streams.append(transfer.stream)
        return TransferResult(
            job_id=transfer.plan.job_id,
            success=True,
            num_bytes=transfer.plan.num_bytes,
            seconds=transfer.start.elapsed_time(transfer.end) / 1000.0,
        )


__all__ = ["CudaTransferHandler"]
