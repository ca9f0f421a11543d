"""Copy throughput of the worker's transfer path against a plain torch copy of the same bytes.

Blocks are 2 MiB (16 tokens x 128 KiB per token slot: a large model's KV per token). A job
copies scattered GPU blocks (every other block, so no two are adjacent) to the tier or back;
the plain copy moves exactly those bytes as one strided torch ``copy_``, and the contiguous copy
moves as many adjacent bytes (an upper bound: scattered 2 MiB blocks cost some memory bandwidth
whoever copies them). On the CPU the path is ``SteppedTransferHandler`` (submit, run, report);
on CUDA it is ``CudaTransferHandler`` (side stream, events, pinned host tier), skipped where no
GPU exists.

Run without asv for a quick look: ``python benchmarks/bench_transfer.py``.

asv reads every number as lower-is-better, so the tracked ratio is the handler's *slowdown*:
handler seconds / plain seconds (1.0 = as fast as a bare copy; 1.25 = 80 % of its throughput).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time

import torch

from kvoffload.core.types import TransferJob, TransferKind
from kvoffload.worker import CudaTransferHandler, KVCache, SteppedTransferHandler

BLOCK_SIZE = 16
SLOT_BYTES = 128 * 1024  # 2 MiB blocks
BLOCKS_PER_JOB = {"cpu": 8, "cuda": 32}  # 16 MiB / 64 MiB per copy


class TransferCopy:
    params = (["cpu", "cuda"], ["store", "load"])
    param_names = ["device", "direction"]
    timeout = 120

    def setup(self, device: str, direction: str) -> None:
        if device == "cuda" and not torch.cuda.is_available():
            raise NotImplementedError("no CUDA device")  # asv: n/a for this parameter
        n = BLOCKS_PER_JOB[device]
        self.kv = KVCache(
            num_gpu_blocks=2 * n,
            block_size=BLOCK_SIZE,
            num_cpu_chunks=2 * n,
            blocks_per_chunk=1,
            slot_bytes=SLOT_BYTES,
            device=device,
        )
        self.kv.gpu.fill_(1)
        self.kv.cpu.fill_(2)
        self.device = device
        self.handler = (
            SteppedTransferHandler(self.kv) if device == "cpu" else CudaTransferHandler(self.kv)
        )
        kind = TransferKind.STORE if direction == "store" else TransferKind.LOAD
        self.template = TransferJob(
            job_id=0,
            req_id="bench",
            kind=kind,
            gpu_block_ids=tuple(range(0, 2 * n, 2)),
            chunk_slots=tuple(range(n, 2 * n)),
            chunk_indices=tuple(range(n)),
        )
        self.submit = (
            self.handler.submit_store if kind is TransferKind.STORE else self.handler.submit_load
        )
        self.job_ids = itertools.count(1)
        # the plain copy: the job's very bytes (GPU blocks 0, 2, 4, ... <-> tier rows n..2n-1) as
        # one strided torch copy_; the contiguous copy: as many bytes, adjacent on both sides
        gpu, tier = self.kv.gpu[0 : 2 * n : 2], self.kv.tier_blocks[n : 2 * n]
        self.plain_src, self.plain_dst = (gpu, tier) if kind is TransferKind.STORE else (tier, gpu)
        gpu, tier = self.kv.gpu[:n], self.kv.tier_blocks[:n]
        self.contiguous_src, self.contiguous_dst = (
            (gpu, tier) if kind is TransferKind.STORE else (tier, gpu)
        )
        self.bytes_per_copy = n * self.kv.block_bytes
        self._sync()

    def teardown(self, device: str, direction: str) -> None:
        handler = getattr(self, "handler", None)
        if handler is not None:
            handler.shutdown()

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def handler_copy(self) -> None:
        """One job through the handler: submit, copy, completion polled."""
        job = self.template._replace(job_id=next(self.job_ids))  # TransferJob is a NamedTuple
        self.submit(job)
        self.handler.wait_all()
        self.handler.get_finished()

    def plain_copy(self) -> None:
        self.plain_dst.copy_(self.plain_src, non_blocking=True)
        self._sync()

    def contiguous_copy(self) -> None:
        self.contiguous_dst.copy_(self.contiguous_src, non_blocking=True)
        self._sync()

    def time_handler_copy(self, device: str, direction: str) -> None:
        self.handler_copy()

    def time_plain_torch_copy(self, device: str, direction: str) -> None:
        self.plain_copy()

    def time_contiguous_torch_copy(self, device: str, direction: str) -> None:
        """The speed of light for this many bytes: no scatter at all."""
        self.contiguous_copy()

    def track_handler_slowdown(self, device: str, direction: str) -> float:
        """Handler time / plain copy time, medians of interleaved samples (lower is better)."""
        handler_s, plain_s = self.median_seconds(rounds=31)
        return handler_s / plain_s

    track_handler_slowdown.unit = "ratio"

    def median_seconds(self, rounds: int) -> tuple[float, float]:
        """Median seconds per copy through the handler and through plain torch.

        Samples alternate in ABBA order: whichever copy runs second finds more of the same bytes
        in cache, and the order would otherwise bias the ratio.
        """
        handler_samples: list[float] = []
        plain_samples: list[float] = []
        pair = [(self.handler_copy, handler_samples), (self.plain_copy, plain_samples)]
        for round_ in range(rounds):
            for fn, samples in pair if round_ % 2 == 0 else pair[::-1]:
                samples.append(_seconds(fn))
        return statistics.median(handler_samples), statistics.median(plain_samples)


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    if sys.argv[1:]:
        print("usage: python benchmarks/bench_transfer.py  (no arguments)", file=sys.stderr)
        sys.exit(2)
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    for device, direction in itertools.product(devices, ["store", "load"]):
        bench = TransferCopy()
        bench.setup(device, direction)
        for _ in range(3):  # warm up
            bench.handler_copy()
            bench.plain_copy()
        handler_s, plain_s = bench.median_seconds(rounds=31)
        contiguous_s = statistics.median(_seconds(bench.contiguous_copy) for _ in range(31))
        bench.teardown(device, direction)
        gb = bench.bytes_per_copy / 1e9
        print(
            f"{device:4} {direction:5}  handler {gb / handler_s:6.2f} GB/s  "
            f"plain torch {gb / plain_s:6.2f} GB/s  contiguous {gb / contiguous_s:6.2f} GB/s  "
            f"handler/plain throughput {plain_s / handler_s:.3f}"
        )
