"""Turning a TransferJob into block rows of both tiers, and copying those rows on the CPU.

A job names GPU blocks and tier chunk slots; :func:`plan_copy` checks it against the KV geometry
and resolves it to pairs of rows (GPU block row, tier sub-block row, see ``kv.py``), merged into
runs that are consecutive on both sides. Every handler copies the same plans; only *when* and
*on what thread or stream* differs.

Pairing, for a chunk size of 4 blocks, chunk slots (7, 2) and ``skip_blocks`` 1 (a load)::

    tier rows    29 30 31 | 8 9 10 11        (slot 7 -> rows 28..31, row 28 skipped)
    gpu blocks    a  b  c | d e  f  g        (job.gpu_block_ids, in order)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch

from kvoffload.core.types import ConfigError, JobId, TransferJob, TransferKind
from kvoffload.worker.kv import KVCache

Run = tuple[int, int, int]  # (first gpu row, first tier row, number of rows)

# A run at least this large is copied by torch (multi-threaded memcpy); smaller runs go through
# numpy views, whose per-call overhead is several times lower than a torch op's.
TORCH_RUN_BYTES = 256 * 1024
# Up to this many small runs are copied slice by slice; more are gathered and scattered at once.
MAX_SLICED_RUNS = 6


class TransferJobError(ValueError):
    """A job that cannot be copied as given (bad ids, sizes, kind or a reused job id).

    Raised at submission, before anything is queued: a malformed job never touches either tier.
    """


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """A validated job, resolved to the rows it copies.

    ``gpu_rows[i]`` pairs with ``tier_rows[i]``; ``runs`` covers the same pairs, merged where both
    sides are consecutive. The source is the GPU for a store and the tier for a load.
    """

    job: TransferJob
    tier_rows: tuple[int, ...]
    runs: tuple[Run, ...]
    num_bytes: int

    @property
    def job_id(self) -> JobId:
        return self.job.job_id

    @property
    def is_store(self) -> bool:
        return self.job.kind is TransferKind.STORE

    @property
    def gpu_rows(self) -> tuple[int, ...]:
        return self.job.gpu_block_ids


def plan_copy(kv: KVCache, job: TransferJob, kind: TransferKind) -> BlockCopy:
    """Validate ``job`` for a ``kind`` submission and resolve it to rows; raise TransferJobError."""
    if job.kind is not kind:
        _fail(job, f"submitted as a {kind.value} but its kind is {job.kind.value}")
    bpc = kv.blocks_per_chunk
    slots = job.chunk_slots
    gpu_rows = job.gpu_block_ids
    skip = job.skip_blocks
    if not slots:
        _fail(job, "has no chunk slots")
    if kind is TransferKind.STORE and skip != 0:
        _fail(job, f"is a store with skip_blocks={skip} (stores always copy whole chunks)")
    if not 0 <= skip < bpc:
        _fail(job, f"skip_blocks={skip} is outside [0, blocks_per_chunk={bpc})")
    expected = len(slots) * bpc - skip
    if len(gpu_rows) != expected:
        _fail(
            job,
            f"lists {len(gpu_rows)} gpu blocks but {len(slots)} chunk(s) x {bpc} blocks - "
            f"{skip} skipped = {expected}",
        )
    if min(slots) < 0 or max(slots) >= kv.num_cpu_chunks:
        bad = next(s for s in slots if not 0 <= s < kv.num_cpu_chunks)
        _fail(job, f"chunk slot {bad} is out of range [0, {kv.num_cpu_chunks})")
    if min(gpu_rows) < 0 or max(gpu_rows) >= kv.num_gpu_blocks:
        bad = next(b for b in gpu_rows if not 0 <= b < kv.num_gpu_blocks)
        _fail(job, f"gpu block id {bad} is out of range [0, {kv.num_gpu_blocks})")
    # Two copies into one destination row would leave whichever ran last: reject, never guess.
    if kind is TransferKind.STORE and len(set(slots)) != len(slots):
        _fail(job, f"writes chunk slot {_first_duplicate(slots)} twice")
    if kind is TransferKind.LOAD and len(set(gpu_rows)) != len(gpu_rows):
        _fail(job, f"writes gpu block {_first_duplicate(gpu_rows)} twice")

    tier_rows = _tier_rows(slots, bpc, skip)
    return BlockCopy(
        job=job,
        tier_rows=tier_rows,
        runs=_merge_runs(gpu_rows, tier_rows),
        num_bytes=len(gpu_rows) * kv.block_bytes,
    )


class CpuBlockCopier:
    """Copies planned rows between the two tiers of a CPU-resident KVCache, synchronously."""

    def __init__(self, kv: KVCache) -> None:
        if kv.is_cuda:
            raise ConfigError(
                f"CPU copies need the GPU blocks in host memory, got device {str(kv.device)!r}; "
                "use CudaTransferHandler"
            )
        self._gpu = kv.gpu
        self._tier = kv.tier_blocks
        self._gpu_np = kv.gpu.numpy()
        self._tier_np = kv.tier_blocks.numpy()
        self._block_bytes = kv.block_bytes

    def copy(self, plan: BlockCopy) -> None:
        runs = plan.runs
        if self._block_bytes * max(n for _, _, n in runs) >= TORCH_RUN_BYTES:
            self._copy_runs(plan, self._gpu, self._tier)
        elif len(runs) <= MAX_SLICED_RUNS:
            self._copy_runs(plan, self._gpu_np, self._tier_np)
        else:
            self._gather_scatter(plan)

    @staticmethod
    def _copy_runs(plan: BlockCopy, gpu, tier) -> None:
        """One slice copy per run; ``gpu`` and ``tier`` are both torch tensors or both arrays."""
        with_torch = isinstance(gpu, torch.Tensor)
        for g, t, n in plan.runs:
            if plan.is_store:
                dst, src = tier[t : t + n], gpu[g : g + n]
            else:
                dst, src = gpu[g : g + n], tier[t : t + n]
            if with_torch:
                dst.copy_(src)
            else:
                dst[...] = src

    def _gather_scatter(self, plan: BlockCopy) -> None:
        gpu_index = np.array(plan.gpu_rows, dtype=np.int64)
        tier_index = np.array(plan.tier_rows, dtype=np.int64)
        if plan.is_store:
            self._tier_np[tier_index] = self._gpu_np[gpu_index]
        else:
            self._gpu_np[gpu_index] = self._tier_np[tier_index]


def _tier_rows(slots: tuple[int, ...], bpc: int, skip: int) -> tuple[int, ...]:
    if bpc == 1:
        return tuple(slots)
    rows = [row for slot in slots for row in range(slot * bpc, slot * bpc + bpc)]
    return tuple(rows[skip:])


def _merge_runs(gpu_rows: tuple[int, ...], tier_rows: tuple[int, ...]) -> tuple[Run, ...]:
    runs: list[Run] = []
    g0, t0, n = gpu_rows[0], tier_rows[0], 0
    for g, t in zip(gpu_rows, tier_rows, strict=True):
        if g == g0 + n and t == t0 + n:
            n += 1
        else:
            runs.append((g0, t0, n))
            g0, t0, n = g, t, 1
    runs.append((g0, t0, n))
    return tuple(runs)


def _first_duplicate(values: tuple[int, ...]) -> int:
    seen: set[int] = set()
    for value in values:
        if value in seen:
            return value
        seen.add(value)
    raise AssertionError("no duplicate")


def _fail(job: TransferJob, problem: str) -> NoReturn:
    raise TransferJobError(f"{job.kind.value} job {job.job_id} (request {job.req_id!r}) {problem}")


__all__ = ["BlockCopy", "CpuBlockCopier", "TransferJobError", "plan_copy"]
