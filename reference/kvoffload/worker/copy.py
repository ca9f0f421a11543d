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

from kvoffload.core.types import ConfigError, JobId, TransferJob, TransferKind
from kvoffload.worker.kv import KVCache

Run = tuple[int, int, int]  # (first gpu row, first tier row, number of rows)

# When both sides are scattered, up to this many runs are copied slice by slice (each slice call
# costs about a microsecond); more are gathered into scratch and scattered (twice the bytes).
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
    if job.chunk_skips:  # a hybrid model's job: any chunk may skip leading sub-blocks
        if len(job.chunk_skips) != len(slots) or not all(0 <= s < bpc for s in job.chunk_skips):
            _fail(job, f"chunk_skips={job.chunk_skips} does not give one skip in [0, {bpc}) per chunk")
        skip = sum(job.chunk_skips)
        if job.chunk_counts and (len(job.chunk_counts) != len(slots) or not all(
                0 < n <= bpc - s for n, s in zip(job.chunk_counts, job.chunk_skips))):
            _fail(job, f"chunk_counts={job.chunk_counts} does not give each chunk 1 to blocks_per_chunk - "
                       "its skip sub-blocks")
    elif kind is TransferKind.STORE and skip != 0:
        _fail(job, f"is a store with skip_blocks={skip} (stores always copy whole chunks)")
    elif not 0 <= skip < bpc:
        _fail(job, f"skip_blocks={skip} is outside [0, blocks_per_chunk={bpc})")
    expected = sum(job.chunk_counts) if job.chunk_skips and job.chunk_counts else len(slots) * bpc - skip
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

    tier_rows = _tier_rows(slots, bpc, skip) if not job.chunk_skips else tuple(
        row for slot, first, count in zip(slots, job.chunk_skips, job.counts(bpc))
        for row in range(slot * bpc + first, slot * bpc + first + count))
    return BlockCopy(
        job=job,
        tier_rows=tier_rows,
        runs=_merge_runs(gpu_rows, tier_rows),
        num_bytes=len(gpu_rows) * kv.block_bytes,
    )


class CpuBlockCopier:
    """Copies planned rows between the two tiers of a CPU-resident KVCache, synchronously.

    One copy call per job, whatever its shape (``docs/performance.md``):

    - one run of consecutive rows on both sides: one slice assignment;
    - destination rows consecutive (a store into consecutive chunk slots, a load into consecutive
      GPU blocks): one gather, ``np.take`` straight into the destination slice;
    - source rows consecutive: one scatter from the source slice;
    - both sides scattered: one slice copy per run while there are few runs, else a gather into a
      scratch array and one scatter (two calls, twice the bytes: the rare case).

    Thread setting, decided: every copy goes through numpy, which copies on the calling thread
    only (``memmove`` per row) and releases the GIL while it does. torch's ``copy_`` would fan
    each call out over its intra-op pool and join on a barrier; on a machine whose cores are
    busy that join costs milliseconds per call whatever its size. A copy here therefore never
    depends on ``torch.get_num_threads()`` or ``OMP_NUM_THREADS``: one core per direction
    (the threaded handler has one thread per direction), none borrowed from the engine.
    """

    def __init__(self, kv: KVCache) -> None:
        if kv.is_cuda:
            raise ConfigError(
                f"CPU copies need the GPU blocks in host memory, got device {str(kv.device)!r}; "
                "use CudaTransferHandler"
            )
        self._gpu = kv.gpu.numpy()
        self._tier = kv.tier_blocks.numpy()
        self.copy_calls = 0  # numpy copy calls made, for the one-call-per-job tests

    def copy(self, plan: BlockCopy) -> None:
        if plan.is_store:
            src, dst, src_rows, dst_rows = self._gpu, self._tier, plan.gpu_rows, plan.tier_rows
        else:
            src, dst, src_rows, dst_rows = self._tier, self._gpu, plan.tier_rows, plan.gpu_rows
        n = len(src_rows)
        s0, d0 = src_rows[0], dst_rows[0]
        self.copy_calls += 1
        if _consecutive(dst_rows):
            if _consecutive(src_rows):
                dst[d0 : d0 + n] = src[s0 : s0 + n]
            else:  # rows already validated in range: "clip" skips numpy's buffered bounds pass
                np.take(src, np.array(src_rows, dtype=np.intp), axis=0, out=dst[d0 : d0 + n], mode="clip")
        elif _consecutive(src_rows):
            dst[np.array(dst_rows, dtype=np.intp)] = src[s0 : s0 + n]
        elif len(plan.runs) <= MAX_SLICED_RUNS:
            self.copy_calls += len(plan.runs) - 1
            for g, t, count in plan.runs:
                s, d = (g, t) if plan.is_store else (t, g)
                dst[d : d + count] = src[s : s + count]
        else:
            self.copy_calls += 1
            dst[np.array(dst_rows, dtype=np.intp)] = src[np.array(src_rows, dtype=np.intp)]


def _consecutive(rows: tuple[int, ...]) -> bool:
    """``rows`` is r, r+1, ..., r+len-1 (so one slice addresses it)."""
    first = rows[0]
    return rows[-1] - first == len(rows) - 1 and all(row == first + i for i, row in enumerate(rows))


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
