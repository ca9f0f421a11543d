"""Sizing the two KV tiers from the workload itself
(``docs/performance.md``, "Sizing the tiers from the workload").

Three ``--set`` forms need the requests before they mean a number, so they are taken out of the
overrides first and resolved once the workload is generated:

- ``gpu_blocks=auto``: the configured pool, grown to the minimum that fits the longest request
  (its prompt, its output and the draft tokens of one step, in whole blocks, plus the null block).
- ``cpu_chunks=<size>`` (``64GiB``, ``512MB``, ``1e9B``): as many chunks as that many bytes of
  host memory hold, at the hardware profile's KV bytes per token (the modelled model's real KV
  width, not the simulated ``slot_bytes``).
- ``cpu_chunks=<share>%``: that share of the workload's distinct chunks (chained chunk hashes of
  every request's prompt + output: what the tier would be asked to hold with no eviction).

The fit check runs before generation where the generator can name its longest request cheaply
(``longest_request(ctx) -> (what, prompt tokens, output tokens)``; the Mooncake loader reads only
the lengths), so a trace that cannot fit is rejected in seconds with the pool the whole trace
needs, not after its tokens were built.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from kvoffload.core.types import cdiv, extend_block_hashes
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.cost import profile as hardware_profile
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads.limits import MAX_TOKENS, max_model_len
from kvoffload.workloads.schema import WorkloadError

AUTO = "auto"
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:e\d+)?)\s*([kmgt]i?b|b)", re.IGNORECASE)
_SHARE = re.compile(r"(\d+(?:\.\d*)?)\s*%")


@dataclass(frozen=True)
class Sizing:
    """The workload-dependent settings of one load (none: every field at its default)."""

    gpu_auto: bool = False
    cpu_bytes: int | None = None
    cpu_share: float | None = None  # in (0, 1]

    @property
    def needs_distinct_chunks(self) -> bool:
        return self.cpu_share is not None

    def resolve_gpu_blocks(self, engine: EngineConfig, what: str, num_prompt: int, num_output: int,
                           display: str) -> EngineConfig:
        """Before generation, from the longest request alone: ``auto`` sized, else checked."""
        if self.gpu_auto:
            needed = min_gpu_blocks(num_prompt + num_output, engine)
            largest = largest_auto_pool(engine)
            if needed > largest:
                raise WorkloadError(f"{display}: {what}: expected prompt + output of at most "
                                    f"{max_model_len(engine.replace(gpu_blocks=largest)):,} tokens (a gpu_blocks=auto "
                                    f"pool holds at most 2**26 token slots, the null block and one step's drafts "
                                    f"included), got {num_prompt:,} + {num_output:,} tokens")
            return engine.replace(gpu_blocks=max(engine.gpu_blocks, needed))
        check_fit(what, num_prompt, num_output, engine, display)
        return engine

    def resolve(self, engine: EngineConfig, requests: Sequence[RequestSpec]) -> EngineConfig:
        """``engine`` with the deferred settings turned into numbers for these requests."""
        changes = {}
        if self.gpu_auto:
            _, num_prompt, num_output = longest(requests)
            changes["gpu_blocks"] = max(engine.gpu_blocks, min_gpu_blocks(num_prompt + num_output, engine))
        if self.cpu_bytes is not None:
            chunk_bytes = engine.tokens_per_chunk * hardware_profile(engine.profile).kv_bytes_per_token
            chunks = self.cpu_bytes // chunk_bytes
            if chunks < 1:
                raise WorkloadError(f"--set cpu_chunks: {self.cpu_bytes} bytes hold no chunk of {chunk_bytes} "
                                    f"bytes ({engine.tokens_per_chunk} tokens x {chunk_bytes // engine.tokens_per_chunk}"
                                    f" bytes of KV per token, profile {engine.profile})")
            changes["cpu_chunks"] = chunks
        if self.cpu_share is not None:
            changes["cpu_chunks"] = max(1, math.ceil(self.cpu_share * distinct_chunks(requests, engine)))
        return engine.replace(**changes) if changes else engine


def split_sizing(overrides: dict[str, str]) -> tuple[dict[str, str], Sizing]:
    """Take the workload-dependent forms out of ``--set`` overrides; the rest pass through."""
    rest = dict(overrides)
    gpu_auto = False
    cpu_bytes = cpu_share = None
    if rest.get("gpu_blocks", "").strip().lower() == AUTO:
        del rest["gpu_blocks"]
        gpu_auto = True
    text = rest.get("cpu_chunks", "").strip()
    if text and not text.isdigit():
        if size := _SIZE.fullmatch(text):
            amount = float(size.group(1)) * _UNITS[size.group(2).lower()]  # inf past 1.8e308
            if not math.isfinite(amount):
                raise WorkloadError(f"--set cpu_chunks={text}: expected a size a float holds (at most 1e308 "
                                    f"bytes), got {size.group(1)} {size.group(2)}")
            cpu_bytes = int(amount)
        elif share := _SHARE.fullmatch(text):
            cpu_share = float(share.group(1)) / 100
            if not 0 < cpu_share <= 1:
                raise WorkloadError(f"--set cpu_chunks={text}: expected a share in (0%, 100%], got {text}")
        else:
            raise WorkloadError(f"--set cpu_chunks={text}: expected a chunk count (8192), a size (64GiB, 500MB) "
                                f"or a share of the workload's distinct chunks (50%), got {text!r}")
        del rest["cpu_chunks"]
    return rest, Sizing(gpu_auto=gpu_auto, cpu_bytes=cpu_bytes, cpu_share=cpu_share)


def largest_auto_pool(engine: EngineConfig) -> int:
    """The most GPU blocks ``gpu_blocks=auto`` grows a pool to: ``limits.MAX_TOKENS`` token slots,
    the null block and the drafts included (a configured pool that is larger is kept as it is).
    The bound is on the pool, not on the request: a request of exactly MAX_TOKENS tokens needs
    one block more than that, and is refused before any token is built."""
    return max(engine.gpu_blocks, MAX_TOKENS // engine.block_size)


def unbounded_lengths(engine: EngineConfig) -> EngineConfig:
    """``engine`` with the largest pool ``gpu_blocks=auto`` may size: what generation is bounded by
    while auto waits for the requests to size it (each request is checked against its
    max_model_len before its tokens are generated)."""
    return engine.replace(gpu_blocks=largest_auto_pool(engine))


def min_gpu_blocks(sequence_tokens: int, engine: EngineConfig) -> int:
    """GPU blocks one request of ``sequence_tokens`` (prompt + output) needs alone, null block included."""
    return cdiv(sequence_tokens + engine.spec_tokens, engine.block_size) + 1


def longest(requests: Iterable[RequestSpec]) -> tuple[str, int, int]:
    """("request ID", prompt tokens, output tokens) of the longest request (the first of equals).
    A streamed trace knows it from its first pass ("line N"): no token is built for it."""
    known = getattr(requests, "longest", None)
    if known is not None:
        return known.what, known.num_prompt_tokens, known.num_output_tokens
    spec = max(requests, key=lambda spec: spec.num_prompt_tokens + spec.max_tokens)
    return f"request {spec.req_id}", spec.num_prompt_tokens, spec.max_tokens


def check_fit(what: str, num_prompt: int, num_output: int, engine: EngineConfig, display: str) -> None:
    """One line naming the pool the longest request needs if it cannot fit (vLLM rejects what
    exceeds max_model_len; the engine would otherwise wait forever for blocks)."""
    needed = min_gpu_blocks(num_prompt + num_output, engine)
    if engine.gpu_blocks < needed:
        raise WorkloadError(f"{display}: {what}: expected prompt + output within max_model_len "
                            f"{max_model_len(engine):,} ((gpu_blocks - 1) x block_size - spec_tokens), got "
                            f"{num_prompt:,} + {num_output:,} tokens; it needs gpu_blocks >= {needed:,} "
                            f"(--set gpu_blocks=auto sizes the pool)")


def distinct_chunks(requests: Iterable[RequestSpec], engine: EngineConfig) -> int:
    """Distinct full chunks over every request's prompt + output (prompt only with
    ``offload_prompt_only``), by chained chunk content: the block hashes of
    ``extend_block_hashes`` taken a chunk at a time."""
    size = engine.tokens_per_chunk
    seen: set[bytes] = set()
    for spec in requests:
        tokens = spec.prompt_token_ids if engine.offload_prompt_only else spec.prompt_token_ids + spec.output_token_ids
        chunk_hashes: list[bytes] = []
        extend_block_hashes(chunk_hashes, tokens, size)
        seen.update(chunk_hashes)
    return len(seen)
