"""A Mamba group in align mode, in the engine: vLLM 0.32's ``MambaManager``
(``vllm/v1/core/single_type_kv_cache_manager.py``) and the scheduler's block-aligned split of
prefill chunks (``Scheduler._mamba_block_aligned_split``, ``vllm/v1/core/sched/scheduler.py``).

In the suite's geometry (one block size for every group and the prefix-cache hash, no prefill
checkpoints) vLLM's partial hits, copy-on-write and checkpoint machinery are off, and what stays
is this (docs/engine.md, "Hybrid models"):

- a request's row is position-indexed and null-padded: one real block, its running state, at
  the index ``cdiv(num_tokens, block_size) - 1`` (drafts counted), then ``k`` speculative state
  blocks under speculative decoding (``MambaSpec.num_speculative_blocks``: one per draft token,
  n-gram too); at most one new block per step, ``1 + k`` in a request's first allocation,
  lookahead ignored (``allocate_new_blocks``, ``get_num_blocks_to_allocate``, whose count may be
  negative once rejected drafts shrank the row's need); a growing row moves its speculative
  blocks that fall below its new running state to its end (``_relocate_speculative_block``);
- the previous state block (``len - 1 - k`` of the row before it grows) is remembered and freed
  once it lies before the block of the last processed token; every non-null block wholly below
  ``processed - 1`` goes back too, stepping over nulls (``remove_skipped_blocks``,
  ``_remove_blocks_in_range``);
- a prefix hit is the rightmost cached state block under the bound (``find_longest_cache_hit``);
  a hit whose state was cached in this very step is not usable before the next one;
- a prefill chunk ends on a block boundary, never past the last cacheable one, nor past a
  shared-prefix junction (``_mamba_block_aligned_split``).

Per-request bookkeeping lives here, keyed by request id, as in vLLM's manager; ``forget`` drops
it when the request lets its blocks go (``pop_blocks_for_free``).
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.core.keys import group_key
from kvoffload.core.types import NULL_BLOCK, BlockId, cdiv
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.drafter import checkpoint_position


class MambaRows:
    """``MambaManager``'s align-mode state for one Mamba group."""

    def __init__(self, group: int, pool: BlockPool, block_size: int, speculative_blocks: int = 0):
        self.group = group
        self.pool = pool
        self.block_size = block_size
        self.speculative_blocks = speculative_blocks  # num_speculative_blocks
        self.allocated: set[str] = set()  # _allocated_block_reqs: the row had its first allocation
        self.last_state_index: dict[str, int] = {}  # last_state_block_idx
        self.retired: dict[str, int] = {}  # _num_retired_blocks
        self.cached_this_step: set[bytes] = set()  # cached_blocks_this_step (group keys)

    # ---- find_longest_cache_hit -------------------------------------------------------------

    def hit(self, hashes: Sequence[bytes], max_length: int) -> list[BlockId]:
        """From the right, the first cached state block under ``max_length``: nulls before it."""
        for i in range(max_length // self.block_size - 1, -1, -1):
            block = self.pool.cached_block(group_key(hashes[i], self.group))
            if block is not None:
                return [NULL_BLOCK] * i + [block]
        return []

    # ---- get_num_blocks_to_allocate / allocate_new_blocks -------------------------------------

    def blocks_needed(self, req_id: str | None, table_length: int, hit: Sequence[BlockId], num_tokens: int) -> int:
        """New blocks (at most one, ``1 + k`` before the first allocation: ``physical_block_cap``;
        fewer than none when the row holds more than it needs) plus the hit's evictable state
        block; a hit cached in this step asks for more than the pool holds, so the request waits."""
        if hit and hit[-1] and self.pool.hash_of(hit[-1]) in self.cached_this_step:
            return self.pool.num_blocks + 1
        k = self.speculative_blocks
        new = cdiv(num_tokens, self.block_size) + k - len(hit) - table_length
        if new > 0:
            new = min(new, 1 if req_id in self.allocated else 1 + k)
        held = [block for block in hit if block]
        return new + self.pool.num_free - self.pool.num_free_after_taking(held)

    def allocate(self, req_id: str, table: list[BlockId], num_tokens: int) -> list[BlockId]:
        """Grow the row to ``num_tokens`` and its ``k`` speculative blocks: nulls up to the
        running state's index, the speculative blocks now below it moved to the end, new blocks
        for the rest; remember the previous state block (the hit's, for a new request). Returns
        the row's entries from its old length on, nulls and moved blocks too, as vLLM's
        ``new_block_ids`` carry them (``allocate_new_blocks`` returns ``req_blocks[prev_block_len:]``)."""
        k = self.speculative_blocks
        required = cdiv(num_tokens, self.block_size) + k
        allocated = req_id in self.allocated
        self.allocated.add(req_id)
        if required <= len(table):
            return []
        previous = len(table)
        if allocated:  # its running state, before its speculative blocks
            self.last_state_index[req_id] = previous - 1 - k
        elif table:  # entering with a hit: the hit's state
            self.last_state_index[req_id] = previous - 1
        running = required - k - 1
        if previous < running:
            table.extend([NULL_BLOCK] * (running - previous))
        if allocated:
            for i in range(previous - k, min(previous, running)):
                table.append(table[i])  # _relocate_speculative_block
                table[i] = NULL_BLOCK
        fresh = self.pool.allocate(max(required - len(table), 0))
        table.extend(fresh)
        return table[previous:]

    # ---- remove_skipped_blocks ----------------------------------------------------------------

    def remove_skipped(self, req_id: str, table: list[BlockId], processed_tokens: int) -> None:
        """Every non-null block below the last processed token's goes back, the last first, once
        (retired blocks are not walked again); then the remembered previous state block, once it
        lies before the block of the last processed token."""
        skipped = processed_tokens - 1
        if skipped > 0:
            first = self.retired.get(req_id, 0)
            last = min(skipped // self.block_size, len(table))
            if first < last:
                freed = []
                for i in range(last - 1, first - 1, -1):
                    if table[i] != NULL_BLOCK:
                        freed.append(table[i])
                        table[i] = NULL_BLOCK
                if freed:
                    self.pool.free(freed[::-1])  # free_blocks(freed): the first listed is reused first
                self.retired[req_id] = last
        index = self.last_state_index.get(req_id)
        if index is not None and index < cdiv(processed_tokens, self.block_size) - 1 and table[index]:
            self.pool.free([table[index]])
            table[index] = NULL_BLOCK

    def forget(self, req_id: str) -> None:
        self.allocated.discard(req_id)
        self.last_state_index.pop(req_id, None)
        self.retired.pop(req_id, None)


def accepted_state_end(end: int, accepted: int, block_size: int, known: int | None = None) -> int:
    """The tokens the state a step leaves in a request's running block summarises: ``end``, the
    last real token's count, or the block boundary that the step's accepted drafts reached, whose
    state the worker copies from its speculative column into that boundary's block, which is the
    running block (``postprocess_mamba_align_gpu``, ``vllm/v1/worker/mamba_utils.py``: the
    accepted tokens cross one boundary at most, as ``k < block_size``). A boundary past the
    ``known`` tokens of the request's sequence (its truth) is not reached: ``end``."""
    boundary = (end + accepted) // block_size * block_size
    reached = accepted and boundary > end and (known is None or boundary <= known)
    return boundary if reached else end


def aligned_split(num_computed: int, num_new: int, num_prompt_tokens: int, num_tokens: int,
                  junction: int, block_size: int, max_prefill_tokens: int, eagle: bool = False) -> int:
    """``Scheduler._mamba_block_aligned_split``: the tokens a prefill chunk from ``num_computed``
    (local and external hits counted) may take of ``num_new`` so that it ends where a Mamba state
    is materialised. 0: nothing fits this step."""
    start = num_computed
    prefill_end = max(num_prompt_tokens, num_tokens - 1)  # a resumed request replays its outputs
    if start >= prefill_end:
        return num_new
    # one token is recomputed on a resend; under EAGLE a block (drafter.checkpoint_position)
    last_cache_position = checkpoint_position(num_tokens, block_size, eagle)
    end = start + num_new
    if end < prefill_end:  # not the prompt's last chunk: end on a block boundary
        aligned_end = end // block_size * block_size
        if aligned_end > start or block_size <= max_prefill_tokens:
            end = aligned_end
    stops = (
        (start // block_size + 1) * block_size if start % block_size else 0,  # started mid-block
        last_cache_position,
        start + (junction - start) // block_size * block_size if start < junction < end else 0,
    )
    end = min((stop for stop in stops if start < stop < end), default=end)
    return max(end - start, 0)
