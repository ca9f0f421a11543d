"""A hybrid model's offload keys: a chunk's key in each KV cache group (vLLM's
``make_offload_key(hash, group)``, ``RequestOffloadState.update_offload_keys``), and each group's
chunk in tokens where the groups have block sizes of their own (vLLM 0.32
``SchedulerOffloadConfig.from_spec``: a group's ``tokens_per_chunk`` is its block size times
blocks per chunk, its ``hashes_per_chunk`` that over the request's hash block)."""

from __future__ import annotations

from math import gcd
from typing import Sequence

from kvoffload.core.request_state import RequestState


def group_key(block_hash: bytes, group: int) -> bytes:
    """A chunk's key in group ``group``; group 0 keeps the bare hash (the dense model's key)."""
    return block_hash + group.to_bytes(4, "big") if group else block_hash


def chunk_tokens(groups, block_size: int, blocks_per_chunk: int) -> tuple[int, ...]:
    """Each group's chunk in tokens: its own block size (or the engine's ``block_size``) times
    ``blocks_per_chunk``."""
    return tuple(group.tokens_per_block(block_size) * blocks_per_chunk for group in groups)


def hash_tokens(groups, block_size: int) -> int:
    """Tokens per request block hash: the groups' block sizes' gcd, as ``EngineCore`` hashes
    (``resolve_kv_cache_block_sizes``, vLLM 0.25+); the engine's block size when they share it."""
    return gcd(*(group.tokens_per_block(block_size) for group in groups))


def refresh_group_keys(state: RequestState, hashes_per_chunk: Sequence[int]) -> None:
    """Every group's keys for the chunks whose last hash exists (the key of chunk i is the hash
    ending where the chunk ends: hashes are chained, so it names the whole prefix)."""
    hashes = state.req.block_hashes
    if all((len(group.offload_keys) + 1) * per > len(hashes) for group, per in zip(state.groups, hashes_per_chunk)):
        return  # no chunk completed since the last refresh (the decode step, mostly)
    for g, (group, per) in enumerate(zip(state.groups, hashes_per_chunk)):
        keys = group.offload_keys
        for last_hash in range((len(keys) + 1) * per - 1, len(hashes), per):
            keys.append(group_key(hashes[last_hash], g))
