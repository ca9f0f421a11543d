"""GPU block pool with prefix caching, in vLLM's free-queue discipline (``vllm/v1/core/block_pool.py``).

- Block 0 is the null block: never handed out.
- A block is *committed* (findable by its chained hash) only once every slot of it holds KV a
  forward pass wrote for the request's real tokens: never the final sampled token's slot, never
  a rejected draft's.
- Blocks with equal hashes are all committed (vLLM does not de-duplicate: block tables stay
  append-only, ``BlockHashToBlockMap``); a lookup takes the earliest still committed.
- Freed committed blocks join the tail of the free queue (least recently freed are reused first,
  and they can still be hit meanwhile); freed uncommitted blocks go to the head, as one group in
  the order they were freed (``BlockPool.free_blocks``: ``prepend_n``), and are handed out next.
  Handing out a committed block evicts its hash.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from kvoffload.core.types import BlockId


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_count = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        # hash -> committed blocks holding it, earliest first (a lookup takes the first)
        self._blocks_of_hash: dict[bytes, list[BlockId]] = {}
        # Free queue: head = next handed out. OrderedDict gives O(1) removal of a cached block
        # that a prefix hit takes back.
        self._free: OrderedDict[BlockId, None] = OrderedDict((b, None) for b in range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def cached_prefix(self, block_hashes: Sequence[bytes], max_blocks: int) -> list[BlockId]:
        """Longest run of committed blocks matching ``block_hashes`` from the start."""
        found = []
        lookup = self._blocks_of_hash
        for block_hash in block_hashes[:max_blocks]:
            blocks = lookup.get(block_hash)
            if blocks is None:
                break
            found.append(blocks[0])
        return found

    def num_free_after_taking(self, blocks: Sequence[BlockId]) -> int:
        """Free blocks left once ``blocks`` (a prefix hit, some maybe free) are taken."""
        return len(self._free) - sum(1 for block in blocks if self._ref_count[block] == 0)

    def take(self, blocks: Sequence[BlockId]) -> None:
        """A request starts using cached blocks (prefix hit)."""
        for block in blocks:
            if self._ref_count[block] == 0:
                del self._free[block]
            self._ref_count[block] += 1

    def allocate(self, n: int) -> list[BlockId]:
        if n > len(self._free):
            raise MemoryError(f"{n} blocks asked, {len(self._free)} free")
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            old_hash = self._hash_of[block]
            if old_hash is not None:  # reuse evicts the cached content
                self._uncache(block, old_hash)
            self._ref_count[block] = 1
            blocks.append(block)
        return blocks

    def commit(self, blocks: Sequence[BlockId], block_hashes: Sequence[bytes], start: int, end: int) -> None:
        """Make blocks ``start..end-1`` of a request findable (``cache_full_blocks``), also when
        another block holds the same hash already."""
        index = self._blocks_of_hash
        for i in range(start, end):
            block, block_hash = blocks[i], block_hashes[i]
            if self._hash_of[block] is None:
                self._hash_of[block] = block_hash
                holders = index.get(block_hash)
                if holders is None:
                    index[block_hash] = [block]
                else:
                    holders.append(block)

    def free(self, blocks: Sequence[BlockId]) -> None:
        """Release a request's blocks, last first, so its tail is reused before its prefix."""
        reuse_first = []
        for block in reversed(blocks):
            self._ref_count[block] -= 1
            if self._ref_count[block] == 0:
                self._free[block] = None
                if self._hash_of[block] is None:
                    reuse_first.append(block)
        for block in reversed(reuse_first):  # the group goes to the head, its order kept
            self._free.move_to_end(block, last=False)

    def reset_prefix_cache(self) -> bool:
        """vLLM 0.32 ``BlockPool.reset_prefix_cache``: refused (False, nothing changes) while any
        block but the null block is in use; otherwise every block loses its hash. The free queue
        keeps its order."""
        if len(self._free) != self.num_blocks - 1:
            return False
        self._blocks_of_hash.clear()
        self._hash_of = [None] * self.num_blocks
        return True

    def uncache_free_blocks(self) -> None:
        """Free blocks lose their hashes (blocks in use keep theirs): memory pressure from
        elsewhere, for stories that need the offload tier to serve. Not a reset: see
        :meth:`reset_prefix_cache`."""
        for block in self._free:
            old_hash = self._hash_of[block]
            if old_hash is not None:
                self._uncache(block, old_hash)

    def _uncache(self, block: BlockId, block_hash: bytes) -> None:
        holders = self._blocks_of_hash[block_hash]
        holders.remove(block)
        if not holders:
            del self._blocks_of_hash[block_hash]
        self._hash_of[block] = None

    def check_invariants(self, blocks_in_use: int, full: bool = True) -> None:
        """``blocks_in_use``: the sum of the live requests' block-table lengths (shared prefix
        blocks counted once per user). ``full`` adds the O(num_blocks) checks."""
        assert self.num_blocks - 1 - len(self._free) <= blocks_in_use, "blocks referenced by no request"
        if not full:
            return
        in_use = sum(1 for b in range(1, self.num_blocks) if self._ref_count[b] > 0)
        assert in_use + len(self._free) == self.num_blocks - 1, "block pool accounting is off"
        assert all(self._ref_count[b] == 0 for b in self._free), "a free block is referenced"
        indexed = 0
        for block_hash, holders in self._blocks_of_hash.items():
            assert holders and all(self._hash_of[block] == block_hash for block in holders), \
                "hash index disagrees with block"
            indexed += len(holders)
        assert indexed == sum(1 for h in self._hash_of if h is not None), "a committed block is not indexed"
