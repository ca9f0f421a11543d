"""The worker's copy throughput against a plain copy of the same bytes (issue 14, item 5).

    .venv/bin/python scripts/measure_transfer.py [--repeats 3] [--rounds 31]

A job copies 8 scattered 2 MiB GPU blocks (every other block) to 8 consecutive tier rows (store)
or back (load), through the threaded handler (submit, background copy, completion polled) and
through the stepped handler. The plain copy moves exactly those bytes as one strided torch
``copy_`` with torch's default thread count. Samples alternate ABBA; medians per repetition.
Throughput ratio = plain seconds / handler seconds (1.0 = as fast as the plain copy).
With ``--connector-meta``, each repetition also times ``build_connector_meta`` at 256 decoding
requests and ``blocks_per_chunk`` 1 (``benchmarks/bench_connector.py``), in the same run.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from script_args import StrictParser, positive_int  # noqa: E402

import torch

from kvoffload.core.types import TransferJob, TransferKind
from kvoffload.worker import KVCache, SteppedTransferHandler, ThreadedCopyHandler

N = 8
BLOCK_SIZE, SLOT_BYTES = 16, 128 * 1024


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(handler_kind: str, direction: str, rounds: int, in_flight: int) -> tuple[float, float]:
    kv = KVCache(2 * N, BLOCK_SIZE, 2 * N, 1, SLOT_BYTES)
    kv.gpu.fill_(1)
    kv.cpu.fill_(2)
    handler = ThreadedCopyHandler(kv) if handler_kind == "threaded" else SteppedTransferHandler(kv)
    kind = TransferKind.STORE if direction == "store" else TransferKind.LOAD
    submit = handler.submit_store if kind is TransferKind.STORE else handler.submit_load
    ids = itertools.count(1)
    template = TransferJob(job_id=0, req_id="bench", kind=kind, gpu_block_ids=tuple(range(0, 2 * N, 2)),
                           chunk_slots=tuple(range(N, 2 * N)), chunk_indices=tuple(range(N)))
    gpu, tier = kv.gpu[0 : 2 * N : 2], kv.tier_blocks[N : 2 * N]
    src, dst = (gpu, tier) if kind is TransferKind.STORE else (tier, gpu)

    def through_handler() -> None:
        for _ in range(in_flight):
            submit(template._replace(job_id=next(ids)))
        handler.wait_all()
        handler.get_finished()

    def plain() -> None:
        for _ in range(in_flight):
            dst.copy_(src)

    samples = {through_handler: [], plain: []}
    for _ in range(3):
        through_handler(), plain()
    for round_ in range(rounds):
        order = (through_handler, plain) if round_ % 2 == 0 else (plain, through_handler)
        for fn in order:
            samples[fn].append(_seconds(fn))
    handler.shutdown()
    return statistics.median(samples[through_handler]), statistics.median(samples[plain])


def main() -> None:
    parser = StrictParser()
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--rounds", type=positive_int, default=31)
    parser.add_argument("--in-flight", type=positive_int, default=1,
                        help="jobs submitted before waiting (the threaded handler's throughput, not its latency)")
    parser.add_argument("--connector-meta", action="store_true")
    args = parser.parse_args()
    print(f"torch threads {torch.get_num_threads()}  OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}  "
          f"load {os.getloadavg()[0]:.2f}  jobs in flight {args.in_flight}")
    mib = args.in_flight * N * BLOCK_SIZE * SLOT_BYTES / 2**20
    for handler_kind, direction in itertools.product(("threaded", "stepped"), ("store", "load")):
        ratios = []
        for _ in range(args.repeats):
            handler_s, plain_s = measure(handler_kind, direction, args.rounds, args.in_flight)
            ratios.append(plain_s / handler_s)
        print(f"{handler_kind:8} {direction:5} {mib:.0f} MiB/wait  handler {mib / 1024 / handler_s:5.2f} GiB/s  "
              f"plain {mib / 1024 / plain_s:5.2f} GiB/s  ratio per repeat "
              + " ".join(f"{r:.3f}" for r in ratios))
    if args.connector_meta:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
        from bench_connector import BuildConnectorMeta

        runs = []
        for _ in range(args.repeats):
            bench = BuildConnectorMeta()
            bench.setup(1)
            runs.append(min(bench.samples()))
            bench.teardown(1)
        print("build_connector_meta bpc 1, 256 requests: " + " ".join(f"{us:.0f}" for us in runs) + " us/step")


if __name__ == "__main__":
    main()
