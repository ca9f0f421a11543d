"""How large a workload may be: bounds that follow from the engine's own limits.

Checked while a workload is read and generated, before anything runs, so bad input fails in
well under a second with one line instead of overflowing, exhausting memory or never ending:

- ``MAX_STEP`` (2**53): arrival steps, gaps, think times and abort delays. The engine skips an
  idle gap in one jump, so a long gap costs nothing; but step numbers feed modelled seconds and
  Chrome-trace timestamps, which are floats, and a float holds every integer only up to 2**53.
- ``max_model_len(engine)``: prompt + output + draft tokens of one request must fit the GPU pool
  on their own ((gpu_blocks - 1) x block_size, as vLLM rejects what exceeds ``max_model_len``).
  Lengths are checked against it before their tokens are generated.
- ``MAX_TOKENS`` (2**26, 67M): the largest length a definition may name at all, six times the
  longest context of any released model (10M tokens); it bounds distribution parameters before
  any engine setting is known, and the pool ``gpu_blocks=auto`` grows to: at most MAX_TOKENS
  token slots, the null block and one step's drafts included, for a generated workload and a
  trace alike (``sizing.largest_auto_pool``). The token generator draws 2 bytes a
  token and ``random.randbytes`` takes at most 2**31 bits at once, so 2**27 tokens is a hard wall.
- ``MAX_REQUESTS`` (10**7) and ``MAX_WORKLOAD_TOKENS`` (2**30): the whole workload lives in
  memory with an 8-byte fingerprint per token (engine) and an 8-byte reference per token (the
  request specs): 2**30 tokens is 16 GiB before anything else, 200 times the largest bundled
  workload.
- ``MAX_WORKERS`` (1024): every transfer result is acknowledged once per worker per step.
- The KV tensors (GPU tier and offload tier) and the block pool must fit this machine's memory.
- ``MAX_JSON_DEPTH`` (64): traces nest 4 levels deep at most; deeper input is rejected before any
  JSON parser sees it (Python's raises RecursionError, the pyarrow reader behind ``datasets``
  crashes the process).
"""

from __future__ import annotations

import os
import re

from kvoffload.engine.config import EngineConfig
from kvoffload.workloads.schema import WorkloadError

MAX_STEP = 2**53
MAX_TOKENS = 2**26
MAX_REQUESTS = 10**7
MAX_WORKLOAD_TOKENS = 2**30
MAX_WORKERS = 1024
MAX_JSON_DEPTH = 64
# Python bookkeeping per GPU block of a full pool (free-queue entry, ref count, hash slot, the
# hash-to-blocks entry of a committed block): measured 216 bytes by tracemalloc and 315 of
# resident memory on a 2**20-block pool with every block committed; the block hashes themselves
# belong to the requests. tests/workloads/test_limits.py holds the traced figure under this one.
POOL_BYTES_PER_BLOCK = 320


def max_model_len(engine: EngineConfig) -> int:
    """Tokens one request may hold: prompt + output + the drafts of its last step."""
    return (engine.gpu_blocks - 1) * engine.block_size - engine.spec_tokens


def check_engine(engine: EngineConfig, where: str) -> None:
    """Engine settings the replay could not represent or hold in memory; ``where`` names them."""
    if engine.workers > MAX_WORKERS:
        raise WorkloadError(f"{where}: workers: expected at most {MAX_WORKERS}, got {engine.workers:,}")
    if engine.store_completion_steps > MAX_STEP:
        raise WorkloadError(f"{where}: store_completion_steps: expected at most 2**53, "
                            f"got {engine.store_completion_steps:,}")
    if max_model_len(engine) < 2:
        slots = (engine.gpu_blocks - 1) * engine.block_size
        raise WorkloadError(f"{where}: spec_tokens: expected at most {slots - 2:,} (the GPU pool's {slots:,} token "
                            f"slots less a request's two), got {engine.spec_tokens:,}")
    gpu = engine.gpu_blocks * (engine.block_size * engine.slot_bytes + POOL_BYTES_PER_BLOCK)
    cpu = engine.cpu_chunks * engine.tokens_per_chunk * engine.slot_bytes
    memory = physical_memory()
    if memory is not None and gpu + cpu > memory:
        raise WorkloadError(f"{where}: the KV tiers (gpu_blocks {engine.gpu_blocks:,} and cpu_chunks "
                            f"{engine.cpu_chunks:,} x blocks_per_chunk {engine.blocks_per_chunk:,}, blocks of "
                            f"block_size {engine.block_size:,} x slot_bytes {engine.slot_bytes:,}) need "
                            f"{_gib(gpu + cpu)}; this machine has {_gib(memory)}")


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: let the allocation decide
        return None


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB" if size < 2**100 else "more than 2**70 GiB"


class Budget:
    """Running totals of a workload being generated: requests, tokens, and each request's fit."""

    def __init__(self, engine: EngineConfig, source: str) -> None:
        self.limit = max_model_len(engine)
        self.source = source
        self.requests = 0
        self.tokens = 0

    def check_length(self, what: str, num_prompt: int, num_output: int = 0) -> None:
        """Before generating a request's tokens (``what``: "request c0-t01", "line 7"): it fits the
        GPU pool, and the workload still fits memory."""
        total = num_prompt + num_output
        if total > self.limit:
            raise WorkloadError(
                f"{self.source}: {what}: expected prompt + output within max_model_len {self.limit:,} "
                f"((gpu_blocks - 1) x block_size - spec_tokens), got {num_prompt:,} + {num_output:,} tokens")
        if self.tokens + total > MAX_WORKLOAD_TOKENS:
            raise WorkloadError(f"{self.source}: {what}: the workload exceeds {MAX_WORKLOAD_TOKENS:,} tokens "
                                f"(2**30; it must fit memory)")

    def add(self, what: str, num_prompt: int, num_output: int) -> None:
        """A request of these lengths joins the workload (checked first)."""
        self.check_length(what, num_prompt, num_output)
        self.requests += 1
        self.tokens += num_prompt + num_output
        if self.requests > MAX_REQUESTS:
            raise WorkloadError(f"{self.source}: {what}: expected at most {MAX_REQUESTS:,} requests "
                                f"(10**7; the workload must fit memory)")


_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


def json_depth_at_most(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether no bracket of ``data`` (JSON text, strings skipped) nests deeper than ``limit``.

    A scan for brackets only, in C-speed passes, safe on input no parser should see: escape pairs
    go first (a backslash always starts one, so removing ``\\\\`` then ``\\"`` left to right
    leaves only the quotes that delimit strings), then everything but quotes and brackets, then
    the strings; what is left is the bracket sequence."""
    if data.count(b"[") + data.count(b"{") <= limit:  # cannot be deeper than its openers
        return True
    structure = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    brackets = _STRING.sub(b"", structure)
    import numpy as np

    steps = np.frombuffer(brackets, dtype=np.uint8)
    depth = np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1), dtype=np.int64)
    return bool(depth.size == 0 or depth.max() <= limit)
