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
from typing import Collection, Hashable, Sequence

from kvoffload.core.types import BlockId


class PrefixWalk(list):
    """A waiting request's GPU prefix-cache walk, kept between its lookups: the blocks found so
    far (``self[i]`` is the block a lookup of ``hashes[i]`` takes now) and how many of them are
    free. The pool keeps it true as blocks are committed, taken, freed and evicted, so the next
    lookup only looks past where this one stopped (issue 14: O(new blocks), not O(prompt))."""

    __slots__ = ("key", "hashes", "num_free")

    def __init__(self, key: Hashable, hashes: Sequence[bytes]):
        super().__init__()
        self.key = key
        self.hashes = hashes  # the request's block hashes (append-only)
        self.num_free = 0  # found blocks with reference count 0


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
        # Kept prefix walks, per caller key (a waiting request), and who watches each found block:
        # block -> [(walk, index of the block in it)].
        self._walks: dict[Hashable, PrefixWalk] = {}
        self._watchers: dict[BlockId, list[tuple[PrefixWalk, int]]] = {}
        self._looked_once: set[Hashable] = set()  # keys looked up once (that walk not kept)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def cached_prefix(self, block_hashes: Sequence[bytes], max_blocks: int,
                      key: Hashable | None = None) -> Sequence[BlockId]:
        """Longest run of committed blocks matching ``block_hashes`` from the start, at most
        ``max_blocks``.

        With ``key`` (a request id), from the key's second lookup on, the walk is kept and the
        next call with the same key and hashes list continues where this one stopped: the
        returned :class:`PrefixWalk` is the pool's own, read-only for the caller (copy it to keep
        it), valid until the pool changes.
        Taking its blocks (:meth:`take`, the request is admitted) or :meth:`forget_prefix` ends
        it. Without ``key``, a fresh list from a full walk.
        """
        lookup = self._blocks_of_hash
        if key is None:
            found = []
            for block_hash in block_hashes[:max_blocks]:
                blocks = lookup.get(block_hash)
                if blocks is None:
                    break
                found.append(blocks[0])
            return found
        walk = self._walks.get(key)
        if walk is None and key not in self._looked_once:
            # A first lookup walks plainly: most requests are admitted by it, and keeping (and
            # then dropping) a walk costs more than the walk. The next lookup keeps its walk.
            self._looked_once.add(key)
            return self.cached_prefix(block_hashes, max_blocks)
        if walk is None or walk.hashes is not block_hashes:
            if walk is not None:
                self._truncate(walk, 0)
            walk = self._walks[key] = PrefixWalk(key, block_hashes)
        index = len(walk)
        if index > max_blocks:
            self._truncate(walk, max_blocks)
            return walk
        watchers, ref_count = self._watchers, self._ref_count
        while index < max_blocks:
            blocks = lookup.get(block_hashes[index])
            if blocks is None:
                break
            block = blocks[0]
            walk.append(block)
            watching = watchers.get(block)
            if watching is None:
                watchers[block] = [(walk, index)]
            else:
                watching.append((walk, index))
            if ref_count[block] == 0:
                walk.num_free += 1
            index += 1
        return walk

    def forget_prefix(self, key: Hashable) -> None:
        """Drop the walk kept for ``key`` (its request finished)."""
        self._looked_once.discard(key)
        walk = self._walks.pop(key, None)
        if walk is not None:
            self._truncate(walk, 0)

    def _truncate(self, walk: PrefixWalk, length: int, keep_blocks: bool = False) -> None:
        """Cut ``walk`` to its first ``length`` blocks; the cut blocks are no longer watched
        (``keep_blocks``: only that, the list stays as it is)."""
        watchers, ref_count = self._watchers, self._ref_count
        for index in range(length, len(walk)):
            block = walk[index]
            watching = watchers[block]
            for position, (watcher, at) in enumerate(watching):  # by identity: walks are lists
                if watcher is walk and at == index:
                    del watching[position]
                    break
            if not watching:
                del watchers[block]
            if ref_count[block] == 0:
                walk.num_free -= 1
        if not keep_blocks:
            del walk[length:]

    def _watched_block_changed(self, block: BlockId, became_free: bool) -> None:
        for walk, _ in self._watchers[block]:
            walk.num_free += 1 if became_free else -1

    def num_free_after_taking(self, blocks: Sequence[BlockId]) -> int:
        """Free blocks left once ``blocks`` (a prefix hit, some maybe free) are taken."""
        if type(blocks) is PrefixWalk:
            return len(self._free) - blocks.num_free
        return len(self._free) - sum(1 for block in blocks if self._ref_count[block] == 0)

    def take(self, blocks: Sequence[BlockId]) -> None:
        """A request starts using cached blocks (prefix hit). A kept walk taken whole ends (its
        request was admitted); the caller's list keeps its blocks."""
        if type(blocks) is PrefixWalk and self._walks.get(blocks.key) is blocks:
            del self._walks[blocks.key]
            self._truncate(blocks, 0, keep_blocks=True)
        watchers = self._watchers
        for block in blocks:
            if self._ref_count[block] == 0:
                del self._free[block]
                if block in watchers:
                    self._watched_block_changed(block, became_free=False)
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
        watchers = self._watchers
        for block in reversed(blocks):
            self._ref_count[block] -= 1
            if self._ref_count[block] == 0:
                self._free[block] = None
                if self._hash_of[block] is None:
                    reuse_first.append(block)
                elif block in watchers:
                    self._watched_block_changed(block, became_free=True)
        for block in reversed(reuse_first):  # the group goes to the head, its order kept
            self._free.move_to_end(block, last=False)

    # ---- hybrid models (engine/kv_groups.py): a group's blocks by key, null blocks in tables ----

    def cached_block(self, key: bytes) -> BlockId | None:
        """The block a lookup of ``key`` takes (the earliest committed), or None."""
        blocks = self._blocks_of_hash.get(key)
        return blocks[0] if blocks is not None else None

    def hash_of(self, block: BlockId) -> bytes | None:
        """The key ``block`` is findable under, or None."""
        return self._hash_of[block]

    def commit_one(self, block: BlockId, key: bytes) -> None:
        """Make ``block`` findable under ``key`` (a group's hash: ``core/keys.py``, ``group_key``)."""
        if self._hash_of[block] is None:
            self._hash_of[block] = key
            self._blocks_of_hash.setdefault(key, []).append(block)

    def free_table(self, table: Sequence[BlockId]) -> None:
        """:meth:`free` for a table that may hold the null block (a sliding window's skipped
        blocks): vLLM's ``free_blocks`` passes over it."""
        self.free([block for block in table if block])

    def reset_prefix_cache(self) -> bool:
        """vLLM 0.32 ``BlockPool.reset_prefix_cache``: refused (False, nothing changes) while any
        block but the null block is in use; otherwise every block loses its hash. The free queue
        keeps its order."""
        if len(self._free) != self.num_blocks - 1:
            return False
        for walk in self._walks.values():  # every block it found loses its hash
            self._truncate(walk, 0)
        self._blocks_of_hash.clear()
        self._hash_of = [None] * self.num_blocks
        return True

    def uncache_free_blocks(self, keep: Collection[BlockId] = ()) -> None:
        """Free blocks lose their hashes (blocks in use keep theirs, and those in ``keep``):
        memory pressure from elsewhere, for stories that need the offload tier to serve. Not a
        reset: see :meth:`reset_prefix_cache`."""
        for block in self._free:
            old_hash = self._hash_of[block]
            if old_hash is not None and block not in keep:
                self._uncache(block, old_hash)

    def _uncache(self, block: BlockId, block_hash: bytes) -> None:
        watching = self._watchers.get(block)
        if watching is not None:  # kept walks found it: they end before it now
            for walk, index in list(watching):
                self._truncate(walk, index)
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
        ref_count, index = self._ref_count, self._blocks_of_hash
        # Whole-list builtins and comprehensions: this runs every FULL_CHECK_EVERY_STEPS steps
        # over every block, so it is written for speed (same checks as one loop per block).
        assert min(ref_count) >= 0, "a negative reference count"
        in_use = self.num_blocks - 1 - ref_count.count(0) + (ref_count[0] == 0)
        assert in_use + len(self._free) == self.num_blocks - 1, "block pool accounting is off"
        assert not any(map(ref_count.__getitem__, self._free)), "a free block is referenced"
        assert all(index.values()), "hash index keeps an empty entry"
        indexed = {block: block_hash for block_hash, holders in index.items() for block in holders}
        assert len(indexed) == sum(map(len, index.values())), "a block is indexed twice"
        committed = {block: block_hash for block, block_hash in enumerate(self._hash_of) if block_hash is not None}
        assert indexed.keys() == committed.keys(), "a committed block is not indexed"
        assert indexed == committed, "hash index disagrees with block"
        watched = 0
        for walk in self._walks.values():  # each kept walk is what a full walk finds, as far as it got
            assert list(walk) == self.cached_prefix(walk.hashes, len(walk)), "a kept prefix walk is stale"
            assert walk.num_free == sum(1 for b in walk if self._ref_count[b] == 0), "a walk's free count is off"
            watched += len(walk)
        assert watched == sum(len(watching) for watching in self._watchers.values()), "walk watchers are off"
