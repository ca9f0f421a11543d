"""A hybrid model's KV cache groups in the engine: vLLM 0.32's ``HybridKVCacheCoordinator`` and
its per-group managers (``vllm/v1/core/kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py``, ``kv_cache_manager.py``) over the engine's one block pool.

Every group keeps its own block table per request (``LiveRequest.tables``; ``tables[0]`` is
``LiveRequest.blocks``) and its own namespace in the prefix cache (``core/keys.py``, ``group_key``); all groups
draw from one pool. The rules, each with its vLLM function (docs/engine.md, "Hybrid models"):

- a prefix hit is the longest every group agrees on (``find_longest_cache_hit``): full attention
  from the left, a sliding window from the right (the last run of blocks its window needs);
  full attention is cut back to it; when full attention found more, that length is the request's
  shared-prefix junction (``shared_prefix_boundary``);
- a sliding window's blocks behind the window are freed and become null blocks
  (``remove_skipped_blocks``), on the processed-token basis, before every allocation and at finish;
- a hit pads the skipped blocks with nulls (``add_local_computed_blocks``); a sliding window
  allocates blocks for an external hit only inside the window (``allocate_external_computed_blocks``);
- a sliding window caches only the blocks a later hit can read (``reachable_block_mask``,
  retention interval, replay boundary and junction);
- admission reserves at most a sliding window's cap (``max_admission_blocks_per_request``);
- a Mamba group (align mode) follows ``MambaManager`` (``mamba.py``): one state block per
  request at its row's last index, the hit the rightmost cached state, and every state it caches
  offered to the connector (``take_boundary_state_offloads``).

The dense model (one full-attention group) never comes here: the scheduler's own code is this
module's one-group case, kept inlined for speed; ``tests/engine/test_kv_groups.py`` holds the two
to the same results.
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.core.keys import group_key
from kvoffload.core.model import GroupKind, KVCacheGroup
from kvoffload.core.types import NULL_BLOCK, BlockId, cdiv
from kvoffload.engine.block_grids import BlockGrids
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.drafter import (checkpoint_position, decode_step_slots, eagle_drafts, replay_boundaries,
                                      speculative_tokens)
from kvoffload.engine.drafter_kv import cut_full_hits, full_attention_groups, joint_full_hit
from kvoffload.engine.live import LiveRequest
from kvoffload.engine.mamba import MambaRows, aligned_split

Tables = list[list[BlockId]]


class HybridKV:
    def __init__(self, config: EngineConfig, pool: BlockPool):
        self.groups: tuple[KVCacheGroup, ...] = config.kv_model.groups
        self.pool = pool
        self.block_size = config.block_size
        # Each group's block size (engine/block_grids.py): the engine's, or the group's own.
        self.grids = BlockGrids(self.groups, config.block_size)
        self.sizes = self.grids.sizes
        self.retention = config.prefix_cache_retention_interval
        # VllmConfig.max_in_flight_tokens: one budget per batch in flight (two under async).
        in_flight = config.max_num_batched_tokens * (2 if config.scheduling == "async" else 1)
        self.caps = [group.admission_cap(size, in_flight) for group, size in zip(self.groups, self.sizes)]
        self.windowed = [g for g, group in enumerate(self.groups) if group.kind is GroupKind.SLIDING_WINDOW]
        # A Mamba group holds a state block per draft token (MambaSpec.num_speculative_blocks).
        self.mamba = {g: MambaRows(g, pool, config.block_size, speculative_tokens(config))
                      for g, group in enumerate(self.groups) if group.kind is GroupKind.MAMBA}
        self.others = [g for g, group in enumerate(self.groups) if group.kind is not GroupKind.FULL_ATTENTION]
        self.full_groups = full_attention_groups(self.groups)  # one lookup (drafter_kv.py)
        # _spec_decode_step_blocks: one decode step's blocks in every non-Mamba group.
        slots = decode_step_slots(config)
        self.spec_step_blocks = sum(cdiv(slots, size) for g, size in enumerate(self.sizes) if g not in self.mamba)
        self.eagle = bool(eagle_drafts(config))  # every group a drafter's: no group of its own (drafter.py)
        # The Mamba states cached since the last schedule, (request, group, block, boundary
        # tokens), for the connector (``_pending_boundary_state_offloads``).
        self.boundary_offers: list[tuple[str, int, BlockId, int]] = []
        self.max_prefill_tokens = config.max_num_batched_tokens  # max_num_scheduled_tokens

    @staticmethod
    def set_tables(live: LiveRequest, tables: Tables) -> None:
        live.tables = tables
        live.blocks = tables[0]

    # ---- get_computed_blocks ----------------------------------------------------------------

    def prefix_hit(self, live: LiveRequest) -> tuple[Tables, int, int]:
        """(hit blocks per group, hit tokens, shared-prefix junction) of a waiting request, at most
        ``num_tokens - 1`` tokens (the last one is recomputed for its logits)."""
        hashes, bs = live.req.block_hashes, self.sizes[0]
        hits: Tables = [[] for _ in self.groups]
        full = self._full_hit(hits, hashes, live.req.num_tokens - 1)
        length = longest = self.grids.aligned(len(full) * bs)
        while True:  # the fixed point of HybridKVCacheCoordinator.find_longest_cache_hit
            candidate = length
            for g in self.others:
                rows = self.mamba.get(g)
                hits[g] = self._window_hit(g, hashes, candidate) if rows is None else rows.hit(hashes, candidate)
                candidate = len(hits[g]) * self.sizes[g]
            if candidate >= length or len(self.others) == 1:  # one other group: one pass (simple hybrid)
                length = min(length, candidate)
                break
            length = candidate
        cut_full_hits(hits, self.full_groups, cdiv(length, bs))
        return hits, length, longest if longest > length else 0

    def prefix_hit_for_connector(self, live: LiveRequest) -> tuple[Tables, int, int, bool]:
        """``get_computed_blocks_for_connector`` (vLLM 0.28+, asked for a connector that sets
        ``supports_divergent_local_hybrid_hits``): with a Mamba group, each group's hit found on
        its own (``find_longest_cache_hit_per_group``, at most ``num_tokens - 1``) and full
        attention's the local hit, even where another group's is shorter: the last value says so
        (diverged), and only the connector can bring the Mamba state at the hit's end. A group
        hitting deeper than full attention, or a model without a Mamba group, takes the hit every
        group agrees on (:meth:`prefix_hit`). No junction: per-group lookups cannot see one."""
        if not self.mamba:
            return (*self.prefix_hit(live), False)
        hashes, max_length = live.req.block_hashes, live.req.num_tokens - 1
        hits: Tables = [[] for _ in self.groups]
        self._full_hit(hits, hashes, max_length)
        for g in self.others:
            rows = self.mamba.get(g)
            hits[g] = self._window_hit(g, hashes, max_length) if rows is None else rows.hit(hashes, max_length)
        lengths = [len(hit) * size for hit, size in zip(hits, self.sizes)]
        if max(lengths) > lengths[0]:  # full attention's blocks were evicted: the agreed hit
            return (*self.prefix_hit(live), False)
        return hits, lengths[0], 0, min(lengths) < lengths[0]

    def _full_hit(self, hits: Tables, hashes: Sequence[bytes], max_length: int) -> list[BlockId]:
        """FullAttentionManager.find_longest_cache_hit, group 0 (and a drafter's full-attention group
        looked up with it, drafter_kv.py): the cached blocks from the left, at most ``max_length``
        tokens, on the group's own grid (cut to the alignment by the caller). Written into ``hits``;
        group 0's returned."""
        grids, bs = self.grids, self.sizes[0]
        if grids.uniform:  # EAGLE and a drafter's group need Mamba, which needs one grid (core/model.py)
            return joint_full_hit(hits, self.pool, hashes, max_length, bs, self.eagle, self.full_groups)
        num_blocks = min(max_length // bs, grids.blocks_hashed(len(hashes), 0))
        hits[0] = self.pool.cached_prefix([grids.block_hash(hashes, 0, i) for i in range(num_blocks)], num_blocks)
        return hits[0]

    def _window_hit(self, g: int, hashes: Sequence[bytes], max_length: int) -> list[BlockId]:
        """SlidingWindowManager.find_longest_cache_hit: from the right, the last run of the blocks
        a window needs, ending on the hit alignment; the blocks before it are null. Short of a
        whole run, the run from block 0."""
        grids, bs = self.grids, self.sizes[g]
        need, uniform = self.groups[g].blocks_for_hit(bs), grids.uniform  # uniform: every rule below a no-op
        num_blocks = min(max_length // bs, grids.blocks_hashed(len(hashes), g))
        found = [NULL_BLOCK] * num_blocks
        run = 0
        for i in range(num_blocks - 1, -1, -1):
            block = self.pool.cached_block(group_key(hashes[i] if uniform else grids.block_hash(hashes, g, i), g))
            if block is None:
                run = 0
                continue
            if not run and not uniform and not grids.run_may_end(g, i + 1):
                continue  # a cached block the alignment cannot end a hit on: skipped, the run not reset
            found[i] = block
            run += 1
            if run >= need:
                del found[i + run:]
                return found
        del found[run:]  # a run from block 0 began on the alignment: no cut needed
        return found

    # ---- allocate_slots -----------------------------------------------------------------------

    def blocks_for_new(self, hits: Tables, total_computed: int, num_tokens: int, capped: bool) -> int:
        """Blocks a waiting request needs for ``num_tokens`` slots (``get_num_blocks_to_allocate``,
        a request without blocks): hit blocks still free count, the window's skipped ones do not."""
        needed = 0
        ref_free = self.pool.num_free_after_taking
        for g, group in enumerate(self.groups):
            if g in self.mamba:
                needed += self.mamba[g].blocks_needed(None, 0, hits[g], num_tokens)
                continue
            bs = self.sizes[g]
            required = cdiv(num_tokens, bs)
            if capped and self.caps[g] is not None:
                required = min(required, self.caps[g])
            skipped = group.skipped_tokens(total_computed) // bs
            needed += max(required - max(skipped, len(hits[g])), 0)
            reused = [block for block in hits[g][skipped:] if block]
            needed += self.pool.num_free - ref_free(reused)
        return needed

    def blocks_for_running(self, live: LiveRequest, num_tokens: int, capped: bool = False,
                           main_tokens: int | None = None) -> int:
        """The same for a request holding blocks (its tables only grow here). A Mamba group counts
        ``main_tokens`` where they differ (``num_tokens_main_model``: no decode step's slots)."""
        needed = 0
        for g, table in enumerate(live.tables):
            if g in self.mamba:
                tokens = num_tokens if main_tokens is None else main_tokens
                needed += self.mamba[g].blocks_needed(live.req_id, len(table), (), tokens)
                continue
            required = cdiv(num_tokens, self.sizes[g])
            if capped and self.caps[g] is not None:
                required = min(required, self.caps[g])
            needed += max(required - len(table), 0)
        return needed

    def adopt(self, live: LiveRequest, hits: Tables, num_local: int, num_external: int) -> None:
        """A waiting request takes its hit (``add_local_computed_blocks``, every group first) and
        blocks for its external hit (``allocate_external_computed_blocks``)."""
        total, sizes = num_local + num_external, self.sizes
        tables: Tables = []
        for g, group in enumerate(self.groups):
            skipped = group.skipped_tokens(total) // sizes[g]
            kept = hits[g][skipped:]
            self.pool.take([block for block in kept if block])
            tables.append([NULL_BLOCK] * skipped + kept)
        live.cached_blocks = [len(table) for table in tables]
        if num_external:
            for g, group in enumerate(self.groups):
                skipped_tokens = group.skipped_tokens(total)
                if skipped_tokens and min(total - skipped_tokens, num_external) <= 0:
                    continue
                tables[g].extend(self.pool.allocate(max(0, cdiv(total, sizes[g]) - len(tables[g]))))
        self.set_tables(live, tables)

    def allocate(self, live: LiveRequest, num_tokens: int) -> tuple[tuple[BlockId, ...], ...]:
        """``allocate_new_blocks``: every group's table grows to ``num_tokens`` slots; returns the
        new blocks per group."""
        fresh = []
        for g, table in enumerate(live.tables):
            if g in self.mamba:
                fresh.append(tuple(self.mamba[g].allocate(live.req_id, table, num_tokens)))
                continue
            new = self.pool.allocate(max(0, cdiv(num_tokens, self.sizes[g]) - len(table)))
            table.extend(new)
            fresh.append(tuple(new))
        return tuple(fresh)

    def remove_skipped(self, live: LiveRequest, processed_tokens: int) -> None:
        """``remove_skipped_blocks``: a window's blocks behind it go back to the pool (the last
        first), their table entries become null; a null entry ends the walk."""
        for g in self.windowed:
            skipped = self.groups[g].skipped_tokens(processed_tokens) // self.sizes[g]
            table = live.tables[g]
            freed = []
            for i in range(min(skipped, len(table)) - 1, -1, -1):
                if table[i] == NULL_BLOCK:
                    break
                freed.append(table[i])
                table[i] = NULL_BLOCK
            if freed:
                self.pool.free(freed[::-1])  # free_blocks(freed): the first listed is reused first
        for g, rows in self.mamba.items():
            rows.remove_skipped(live.req_id, live.tables[g], processed_tokens)

    def cache(self, live: LiveRequest, num_tokens: int) -> None:
        """``cache_blocks`` in every group: the full blocks below ``num_tokens``, a window's only
        where a later hit can read them."""
        req, grids = live.req, self.grids
        if not grids.uniform:  # _align_cacheable: what a hit can end on
            self._cache_groups(live, grids.aligned(num_tokens))
            return
        bs = self.block_size
        full_blocks = num_tokens // bs
        if self.mamba:
            self._mark_prompt_state(live, full_blocks)
        if full_blocks <= min(live.cached_blocks):
            return  # the decode step: no block filled
        junction = req.shared_prefix_boundary
        boundaries = replay_boundaries(req.num_prompt_tokens, bs, self.eagle) + ((junction,) if junction else ())
        for g, group in enumerate(self.groups):
            start = live.cached_blocks[g]
            if start >= full_blocks:
                continue
            table, hashes = live.tables[g], req.block_hashes
            mask = group.reachable_block_mask(start, full_blocks, bs, bs, self.retention, boundaries)
            for i in range(start, full_blocks):
                if table[i] and (mask is None or mask[i - start]):
                    self.pool.commit_one(table[i], group_key(hashes[i], g))
            if g in self.mamba:  # every cached state: not a hit this step, offered to the connector
                for i in range(start, full_blocks):
                    key = self.pool.hash_of(table[i]) if table[i] else None
                    if key is not None:
                        self.mamba[g].cached_this_step.add(key)
                        self.boundary_offers.append((live.req_id, g, table[i], (i + 1) * bs))
            live.cached_blocks[g] = full_blocks

    def _cache_groups(self, live: LiveRequest, num_tokens: int) -> None:
        """``cache_blocks`` on groups of their own block sizes (no Mamba group): each group's full
        blocks below ``num_tokens`` (aligned), a window's where a later hit can read them, the
        alignment the groups' lcm (``cache_hit_alignment_tokens``)."""
        req, grids = live.req, self.grids
        junction = req.shared_prefix_boundary
        boundaries = (req.num_prompt_tokens - 1, junction) if junction else (req.num_prompt_tokens - 1,)
        for g, group in enumerate(self.groups):
            start, bs = live.cached_blocks[g], self.sizes[g]
            full_blocks = num_tokens // bs
            if start >= full_blocks:
                continue
            table, hashes = live.tables[g], req.block_hashes
            mask = group.reachable_block_mask(start, full_blocks, bs, grids.scheduler, self.retention, boundaries)
            for i in range(start, full_blocks):
                if table[i] and (mask is None or mask[i - start]):
                    self.pool.commit_one(table[i], group_key(grids.block_hash(hashes, g, i), g))
            live.cached_blocks[g] = full_blocks

    def _mark_prompt_state(self, live: LiveRequest, full_blocks: int) -> None:
        """``MambaManager._cache_partial_tail_block``, in the suite's geometry: a caching call
        ending exactly at the prompt's replay boundary (``num_prompt_tokens - 1`` rounded down,
        the coordinator's ``_align_cacheable``; a block lower under EAGLE, drafter.checkpoint_position) registers the state block there again, hit or not,
        so a sibling cannot take it as its hit in this step (``cached_blocks_this_step``)."""
        req, bs = live.req, self.block_size
        if not full_blocks or full_blocks * bs != checkpoint_position(req.num_prompt_tokens, bs, self.eagle):
            return
        for g, rows in self.mamba.items():
            table = live.tables[g]
            block = table[full_blocks - 1] if full_blocks <= len(table) else NULL_BLOCK
            if block:
                self.pool.commit_one(block, group_key(req.block_hashes[full_blocks - 1], g))
                rows.cached_this_step.add(self.pool.hash_of(block))

    # ---- free -----------------------------------------------------------------------------------

    def release(self, live: LiveRequest, deferred: list | None, seq: int) -> None:
        """The request lets its blocks go: every group's back to the pool, group after group
        (``KVCacheCoordinator.free``), or, while a step in flight may still write them, the
        groups' tables one after the other onto ``deferred`` (``pop_blocks_for_free``)."""
        if deferred is None:
            self.free_tables(live.tables)
        else:
            deferred.append((seq, [block for table in live.tables for block in table if block]))
        self.clear(live)

    def free_tables(self, tables: Tables) -> None:
        for table in tables:
            self.pool.free_table(table)

    def finishing(self, live: LiveRequest) -> tuple[tuple[BlockId, ...], ...]:
        """``_connector_finished``: the window's skipped blocks go first (processed tokens), the
        connector sees the tables cut at the computed tokens."""
        req = live.req
        self.remove_skipped(live, max(0, req.num_computed_tokens - live.in_flight_tokens))
        return self.block_ids(live, req.num_computed_tokens)

    def blocks_in_use(self, running, holding, awaiting) -> int:
        """Blocks the live requests hold (their tables' non-null entries) and the blocks of loads
        an abort left in flight."""
        held = self.blocks_held
        return (sum([held(live) for live in running]) + sum([held(live) for live in holding])
                + sum([len(table) - table.count(NULL_BLOCK) for tables in awaiting for table in tables]))

    def clear(self, live: LiveRequest) -> None:
        """The request holds no blocks: its Mamba bookkeeping and its states not yet offered go
        too (``MambaManager.pop_blocks_for_free``)."""
        self.set_tables(live, [[] for _ in self.groups])
        live.cached_blocks = [0] * len(self.groups)
        if self.mamba:
            for rows in self.mamba.values():
                rows.forget(live.req_id)
            if self.boundary_offers:
                self.boundary_offers = [offer for offer in self.boundary_offers if offer[0] != live.req_id]

    # ---- the step's bookkeeping (Mamba only) ----------------------------------------------------

    def new_step_starts(self) -> None:
        """``KVCacheManager.new_step_starts``: states cached before this schedule are usable hits."""
        for rows in self.mamba.values():
            rows.cached_this_step.clear()

    def split(self, live: LiveRequest, num_computed: int, num_new: int) -> int:
        """A prefill chunk cut where a Mamba state is materialised (``mamba.aligned_split``); the
        callers ask only with a Mamba group (``need_mamba_block_aligned_split``)."""
        req = live.req
        return aligned_split(num_computed, num_new, req.num_prompt_tokens, req.num_tokens,
                             req.shared_prefix_boundary, self.block_size, self.max_prefill_tokens, self.eagle)

    def take_boundary_offers(self) -> dict[str, tuple[tuple[int, BlockId, int], ...]]:
        """``take_boundary_state_offloads``: per request, (group, block, boundary) in offer order."""
        offers: dict[str, list] = {}
        for req_id, g, block, boundary in self.boundary_offers:
            offers.setdefault(req_id, []).append((g, block, boundary))
        self.boundary_offers = []
        return {req_id: tuple(entries) for req_id, entries in offers.items()}

    def remaining_blocks(self, live: LiveRequest, extra: int) -> int:
        """``_request_remaining_blocks``: what an admitted prefill still needs for its whole
        sequence and, with drafts, one decode step (``extra``), which a Mamba group leaves out: it
        counts ``num_tokens_main_model``, the sequence alone (``MambaManager.get_num_blocks_to_allocate``)."""
        return self.blocks_for_running(live, live.req.num_tokens + extra, capped=True, main_tokens=live.req.num_tokens)

    @staticmethod
    def blocks_held(live: LiveRequest) -> int:
        return sum([len(table) - table.count(NULL_BLOCK) for table in live.tables])

    def block_ids(self, live: LiveRequest, num_tokens: int | None = None) -> tuple[tuple[BlockId, ...], ...]:
        """The tables as the connector sees them; with ``num_tokens``, cut to the blocks covering
        that many tokens (``get_block_ids_for_computed_tokens``)."""
        if num_tokens is None:
            return tuple(tuple(table) for table in live.tables)
        return tuple(tuple(table[:cdiv(num_tokens, size)]) for table, size in zip(live.tables, self.sizes))
