"""An MTP/EAGLE drafter's KV cache group of its own: a full-attention group flagged
``is_eagle_group`` (``KVCacheGroup.drafter``; the model ``qwen3-next-mtp``), beside the target's
groups (docs/engine.md, "Hybrid models", "A drafter group of its own").

The prefix cache (vLLM 0.32 ``HybridKVCacheCoordinator``, ``kv_cache_coordinator.py``): groups of
one spec are looked up together (``verify_and_split_kv_cache_groups``, ``SpecGroup``), so the
drafter's full-attention group and the target's share one lookup: a block counts where every
member group has it cached (``FullAttentionManager.find_longest_cache_hit`` over the spec
group's ids), and the EAGLE drop, decided for the whole spec group, cuts both.

The KV oracle: the drafter's first pass reads the target's tokens shifted by one
(``SpecDecodeBaseProposer.set_inputs_first_pass``, ``vllm/v1/spec_decode/llm_base_proposer.py``:
the input at position ``i`` is token ``i + 1``, the last one the token sampled in the step or,
mid-prefill, the next prompt token, ``prepare_next_token_ids_cpu``), at the target's positions
and slots. A drafter slot at position ``i`` therefore holds KV of the prefix through token
``i + 1``: written in the step that computes position ``i``, and it names one token past its
position. A load of a drafter chunk ending at ``h`` carries the storing request's token ``h``:
clean only where the loading request's token ``h`` is the same, which the drafter group's
lookup (one chunk further, then dropped; core/drafter.py) and the GPU cache's EAGLE drop make
sure of.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kvoffload.core.keys import group_key
from kvoffload.core.model import GroupKind, KVCacheGroup
from kvoffload.core.types import BlockId
from kvoffload.engine.drafter import full_attention_hit

# How far a drafter slot's prefix reaches past its position (set_inputs_first_pass's shift).
DRAFTER_LEAD = 1


def full_attention_groups(groups: Sequence[KVCacheGroup]) -> list[int]:
    """The full-attention groups, the target's (group 0) first: one spec group in vLLM."""
    return [g for g, group in enumerate(groups) if group.kind is GroupKind.FULL_ATTENTION]


def drafter_slot_groups(groups: Sequence[KVCacheGroup]) -> frozenset[int]:
    """The groups whose slots the drafter writes (flagged ``is_eagle_group``)."""
    return frozenset(g for g, group in enumerate(groups) if group.drafter)


def joint_full_hit(hits: list[list[BlockId]], pool, hashes: Sequence[bytes], max_length: int, block_size: int,
                   eagle: bool, full_groups: Sequence[int]) -> list[BlockId]:
    """The full-attention spec group's hit, written into ``hits`` for each member group; returns
    group 0's. One member: ``full_attention_hit`` as before."""
    if len(full_groups) == 1:
        hits[0] = full_attention_hit(pool.cached_prefix, hashes, max_length, block_size, eagle)
        return hits[0]
    others = full_groups[1:]

    def cached_in_all(block_hashes: Sequence[bytes], max_blocks: int) -> list[BlockId]:
        found = list(pool.cached_prefix(block_hashes, max_blocks))
        for i, block_hash in enumerate(block_hashes[:len(found)]):
            if any(pool.cached_block(group_key(block_hash, g)) is None for g in others):
                del found[i:]
                break
        return found

    hits[0] = full_attention_hit(cached_in_all, hashes, max_length, block_size, eagle)
    for g in others:
        hits[g] = [pool.cached_block(group_key(block_hash, g)) for block_hash in hashes[:len(hits[0])]]
    return hits[0]


def cut_full_hits(hits: list[list[BlockId]], full_groups: Sequence[int], num_blocks: int) -> None:
    """Every full-attention group cut back to the hit every group agrees on."""
    for g in full_groups:
        del hits[g][num_blocks:]


def drafter_writes(fingerprints: np.ndarray, item) -> tuple[np.ndarray, np.ndarray]:
    """(positions, fingerprints) the drafter writes for one scheduled request: positions
    ``start .. start + n - 1`` with the prefixes through one token further. The engine proposes
    no EAGLE drafts (engine/drafter.py), so every token the drafter reads is the script's."""
    start, end = item.start, item.start + item.num_tokens
    end = min(end, len(fingerprints) - DRAFTER_LEAD)  # the script's last token is never an input
    positions = np.arange(start, end, dtype=np.int64)
    return positions, fingerprints[start + DRAFTER_LEAD:end + DRAFTER_LEAD]


def drafter_slots(scheduled: Sequence, group: int, block_size: int, fingerprints_of, salt: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The slots and values the drafter writes into group ``group`` this step (salted)."""
    slots, values = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for item in scheduled:
        if item.num_tokens:
            positions, held = drafter_writes(fingerprints_of[item.live.req_id], item)
            table = np.asarray(item.live.tables[group], dtype=np.int64)
            slots.append(table[positions // block_size] * block_size + positions % block_size)
            values.append(held ^ np.int64(salt))
    return np.concatenate(slots), np.concatenate(values)
