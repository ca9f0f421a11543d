"""A hybrid model's offload keys: a chunk's key in each KV cache group (vLLM's
``make_offload_key(hash, group)``, ``RequestOffloadState.update_offload_keys``)."""

from __future__ import annotations

from kvoffload.core.request_state import RequestState


def group_key(block_hash: bytes, group: int) -> bytes:
    """A chunk's key in group ``group``; group 0 keeps the bare hash (the dense model's key)."""
    return block_hash + group.to_bytes(4, "big") if group else block_hash


def refresh_group_keys(state: RequestState, blocks_per_chunk: int) -> None:
    """Every group's keys for the chunks whose last block's hash exists (the key of chunk i is
    the hash of its last block: hashes are chained, so it names the whole prefix)."""
    hashes = state.req.block_hashes
    groups = state.groups
    if (len(groups[0].offload_keys) + 1) * blocks_per_chunk > len(hashes):
        return  # no chunk completed since the last refresh (the decode step, mostly)
    for g, group in enumerate(groups):
        keys = group.offload_keys
        for last_block in range((len(keys) + 1) * blocks_per_chunk - 1, len(hashes), blocks_per_chunk):
            keys.append(group_key(hashes[last_block], g))
