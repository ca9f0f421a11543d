"""The reference connector's scheduler side for a hybrid model: every KV cache group keyed,
looked up, loaded and stored on its own (vLLM 0.32 ``offloading/scheduler.py``, which grew its
group handling from 0.25 on).

What differs from one full-attention group (docs/engine.md, "Hybrid models"):

- keys per group: the chunk's hash in the group's namespace (:func:`group_key`, vLLM's
  ``make_offload_key(hash, group)``), each group its own blocks and store cursor (``GroupState``);
- the lookup (``_lookup_complete_chunks``): full attention from the GPU hit to the right, then a
  sliding window from the right (the last run of the chunks its window needs), the hit shrinking
  until every group agrees; with a window the prompt's last token is never served;
- a load carries every group's chunks, a window's only from its first block still held
  (``update_state_after_alloc``);
- stores (``hybrid_stores.py``): a window's chunks only where a later lookup can read them, its
  blocks fenced from the store's creation, its table entries reallocated meanwhile zeroed (PR #42959);
- a Mamba group (align mode) is a window of one chunk whose hit ends on a stored state (the bound
  rounded down to a chunk, K18), stored only from the engine's boundary-state hand-off.

The fix flags mean what they mean for one group; presets pick the release's group rules
(``ReleaseRules``).
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.core.drafter import drafter_groups
from kvoffload.core.fixes import Fixes, WindowRules
from kvoffload.core.hybrid_stores import HybridStorePlanner
from kvoffload.core.keys import chunk_tokens, group_key, hash_tokens, refresh_group_keys
from kvoffload.core.manager import CPUOffloadManager, LookupResult
from kvoffload.core.model import GroupKind, model_named
from kvoffload.core.request_state import GroupState, RequestState
from kvoffload.core.scheduler import ReferenceConnectorScheduler
from kvoffload.core.types import (
    NULL_BLOCK,
    BlockId,
    ConnectorConfig,
    ConnectorCrash,
    JobId,
    RequestView,
    SchedulerOutput,
    TransferJob,
    TransferKind,
    cdiv,
)


class HybridConnectorScheduler(ReferenceConnectorScheduler):
    def __init__(self, config: ConnectorConfig, fixes: Fixes | None = None,
                 manager: CPUOffloadManager | None = None):
        super().__init__(config, fixes, manager)
        model = model_named(config.model)
        self.fixes.check_model(model)
        self.groups = model.groups
        # Each group's chunk in tokens (its own block size where the model gives one, one block
        # a chunk then, as vLLM's OffloadingConnector chunks such groups) and in request hashes.
        self._tpc = chunk_tokens(self.groups, config.block_size, config.blocks_per_chunk)
        self._hpc = tuple(tpc // hash_tokens(self.groups, config.block_size) for tpc in self._tpc)
        windows = [group.window_chunks(tpc) for group, tpc in zip(self.groups, self._tpc)]
        self._windows = windows
        full = [g for g, window in enumerate(windows) if window is None]
        self._sliding = tuple(sorted((g for g, window in enumerate(windows) if window is not None),
                                     key=lambda g: windows[g], reverse=True))
        self._lookup_order = tuple(full) + self._sliding
        self._has_mamba = model.has_mamba
        # vLLM 0.30's window lookup (padded rightmost run, a pending chunk behind a miss does not
        # defer) and stores (reachable chunks only); before it, ReleaseRules.windows says.
        self._windows_0_30 = self.fixes.rules.windows is WindowRules.REACHABLE_CHUNKS
        self._stores = HybridStorePlanner(config, self.fixes, self.manager, self.jobs, self.stats,
                                          self._cursor_moved, self.groups, self._touch, self._tpc, self._hpc)
        # the groups an EAGLE/MTP drafter's (core/drafter.py): their lookups and stores lose a chunk
        self._drafters = self._stores.drafters = drafter_groups(self.groups, config.eagle_drafts, self.fixes.rules)

    def connector_groups(self) -> int:
        return len(self.groups)

    # ---- per-group state --------------------------------------------------------------------

    def on_new_request(self, req: RequestView) -> None:
        state = RequestState(req, groups=[GroupState() for _ in self.groups])
        self._requests[req.req_id] = state
        self.manager.on_new_request(req.req_id)
        self._refresh_keys(state)

    def _refresh_keys(self, state: RequestState) -> None:
        refresh_group_keys(state, self._hpc)

    def _clear_blocks(self, state: RequestState) -> None:
        for group in state.groups:
            group.block_ids.clear()

    def _touch(self, state: RequestState, hit_end: int | None = None) -> None:
        """vLLM <= 0.30's ``_touch``: a full-attention group's keys all, a window's from the
        window before the admission's hit on (``num_hit_tokens``; its earlier chunks were never
        needed). A lookup passes the hit's end; a store touches with the last admission's."""
        if hit_end is not None:
            state.num_hit_tokens = hit_end
        keys = []
        for g, group in enumerate(state.groups):
            window = self._windows[g]
            keys.extend(group.offload_keys[max(0, state.num_hit_tokens // self._tpc[g] - window):] if window
                        else group.offload_keys)
        self.manager.touch(keys)

    def next_stored_chunk(self, req_id: str) -> int:
        return self._requests[req_id].groups[0].next_stored_chunk

    # ---- admission: lookup and load ---------------------------------------------------------

    def _lookup(self, state: RequestState, num_local_tokens: int) -> int | None:
        """``_lookup_complete_chunks``: tokens past the GPU hit that every group can load, in whole
        chunks; None: ask again (a chunk is pending or being loaded)."""
        max_hit = self._lookup_bound(state.req)
        num_hit, defer, order = 0, False, self._lookup_order
        verified: set[int] = set()  # drafter groups that dropped their chunk this round (eagle_verified)
        while order:
            looked_at_window = False
            groups, order = order, ()
            for g in groups:
                keys, tpc = state.groups[g].offload_keys, self._tpc[g]
                max_hit = min(max_hit, len(keys) * tpc)
                if max_hit - num_local_tokens < tpc:
                    return 0
                drop = int(g in self._drafters and g not in verified)  # one chunk more, then dropped
                num_chunks = min(cdiv(min(max_hit + drop * tpc, len(keys) * tpc), tpc), len(keys))
                start = num_local_tokens // tpc
                window = self._windows[g]
                if window is None:
                    found = self._prefix_lookup(keys, start, num_chunks)
                else:
                    first = self.groups[g].load_window_chunks(tpc, min(max_hit, (num_chunks - drop) * tpc)) \
                        if self._windows_0_30 else window
                    found = self._window_lookup(keys, start, num_chunks, window + drop, first + drop)
                if found == 0:
                    return 0
                if found is None:
                    defer = True
                else:
                    if drop:
                        found -= 1
                        verified.add(g)
                    max_hit = min(max_hit, tpc * (start + found))
                if max_hit - num_local_tokens < tpc:
                    return 0
                if max_hit - num_local_tokens < num_hit:
                    if g not in self._drafters:  # a shorter hit: every drafter group drops again
                        verified.clear()
                    if defer:  # once more over every group: does it still defer?
                        defer, order = False, self._lookup_order
                    elif looked_at_window and not order:  # the windows again, at the shorter hit
                        order = self._sliding
                looked_at_window |= window is not None
                num_hit = max_hit - num_local_tokens
        if defer or self._being_loaded(state, num_local_tokens, num_hit):
            return None
        self.stats.lookups += 1
        self.stats.queried_tokens += len(state.groups[0].offload_keys) * self._tpc[0] - num_local_tokens
        self.stats.hit_tokens += num_hit
        return num_hit

    def _lookup_bound(self, req: RequestView) -> int:
        """The most tokens a hit may cover. With a window the prompt's last token is recomputed
        (one token short); with a Mamba group the hit must also end where a state was stored, a
        chunk's end, so the bound rounds down to one (vLLM #44599, catalogue K18; vLLM 0.32
        ``_lookup_complete_chunks``, ``resolve_mamba_align_size``): a hit one token short of a
        stored state would restore the state of a token the request computes again."""
        bound = req.num_tokens - (1 if self._sliding else 0)
        if self._has_mamba:
            bound -= bound % self.config.tokens_per_chunk
        return bound

    def _prefix_lookup(self, keys: Sequence[bytes], start: int, end: int) -> int | None:
        """``_maximal_prefix_lookup``: hit chunks from ``start`` until the first miss; a pending
        one counts and defers."""
        hit, pending = 0, False
        for key in keys[start:end]:
            result = self.manager.lookup(key)
            if result is LookupResult.MISS:
                break
            pending |= result is LookupResult.HIT_PENDING
            hit += 1
        return None if pending else hit

    def _window_lookup(self, keys: Sequence[bytes], start: int, end: int, window: int, first: int) -> int | None:
        """``_sliding_window_lookup``: from the right, the end of the last run of ``window`` hit
        chunks (``first`` for the rightmost run, whose last chunk may be partial); short of one,
        the run from ``start``. A pending chunk in the run counts and defers."""
        keys = keys[start:end]
        pending, run, required = False, 0, first
        for index in range(len(keys) - 1, -1, -1):
            result = self.manager.lookup(keys[index])
            if result is LookupResult.MISS:
                run, required = 0, window
                if self._windows_0_30:  # PR #56486: a pending chunk behind a gap no longer defers
                    pending = False
            else:
                pending |= result is LookupResult.HIT_PENDING
                run += 1
            if run == required:
                return None if pending else index + required
        return None if pending else run

    def _being_loaded(self, state: RequestState, num_local: int, num_hit: int) -> bool:
        """A chunk of the hit (a window's: the chunks its load carries) is loading for another request."""
        if not self._chunks_being_loaded:
            return False
        end = num_local + num_hit
        for g, group in enumerate(state.groups):
            tpc = self._tpc[g]
            keys = group.offload_keys[num_local // tpc:cdiv(end, tpc)]
            window = self.groups[g].load_window_chunks(tpc, end) if self._windows_0_30 else self._windows[g]
            if window is not None:
                keys = keys[-window:]
            if not self._chunks_being_loaded.isdisjoint(keys):
                return True
        return False

    def update_state_after_alloc(self, req: RequestView, block_ids: Sequence[Sequence[BlockId]],
                                 num_external_tokens: int) -> None:
        """The load of every group's hit chunks, a window's from its first block still held. Every
        group's allocation is recorded for the fence first, hits or not (catalogue K13, as
        ``ReferenceConnectorScheduler.update_state_after_alloc``)."""
        for blocks in block_ids:
            self._allocated_this_step.update(b for b in blocks if b != NULL_BLOCK)
        if num_external_tokens == 0:
            return
        state, bpc = self._requests[req.req_id], self.config.blocks_per_chunk
        num_cached = state.num_local_tokens + num_external_tokens
        keys, destination, indices, groups, skips = [], [], [], [], []
        for g, group in enumerate(state.groups):
            blocks, tpc = block_ids[g], self._tpc[g]
            bs = tpc // bpc  # the group's own block size
            num_blocks, end_chunk = cdiv(num_cached, bs), cdiv(num_cached, tpc)
            first_fresh = cdiv(state.num_local_tokens, bs)
            start = next((i for i in range(first_fresh, num_blocks) if blocks[i] != NULL_BLOCK), num_blocks)
            pending = num_blocks - start
            window = self._windows[g]
            if window is not None and pending > self.pending_window_blocks(window):
                raise ConnectorCrash(f"assert num_pending_gpu_blocks <= window: {req.req_id!r} group {g} "
                                     f"loads {pending} blocks")
            if pending:
                first_chunk = start // bpc
                keys.extend(group.offload_keys[first_chunk:end_chunk])
                indices.extend(range(first_chunk, end_chunk))
                groups.extend([g] * (end_chunk - first_chunk))
                skips.extend([start % bpc] + [0] * (end_chunk - first_chunk - 1))
                destination.extend(blocks[start:num_blocks])
            group.next_stored_chunk = end_chunk  # hit chunks are not stored again
        self._cursor_moved.append(state)
        if self._has_jobs(state):  # only with defer_lookup_while_transferring off (vLLM issue #46014)
            raise ConnectorCrash(f"assert not transfer_jobs: load for {req.req_id!r} while it has jobs in flight")
        slots = self.manager.prepare_load(req.req_id, keys, list(zip(indices, groups)))
        job_id = self.jobs.add_load(req.req_id, tuple(keys))
        self._chunks_being_loaded.update(keys)
        self.stats.load_jobs += 1
        self._load_jobs_this_step.append(TransferJob(
            job_id, req.req_id, TransferKind.LOAD, tuple(destination), slots, tuple(indices),
            chunk_groups=tuple(groups), chunk_skips=tuple(skips)))

    def pending_window_blocks(self, window_chunks: int) -> int:
        """The most window blocks a load may still need (``update_state_after_alloc``'s assert):
        the window in blocks and one more, for a hit ending inside a block (vLLM #48959, PR #49052,
        0.27+; with groups of their own block sizes a full-attention chunk can end there, K16);
        0.25-0.26 allowed the window in blocks only (``ReleaseRules.window_load_spare_block``)."""
        return window_chunks * self.config.blocks_per_chunk + int(self.fixes.rules.window_load_spare_block)

    # ---- the plan of one step ---------------------------------------------------------------

    def _take_new_blocks(self, out: SchedulerOutput, allocated: set[BlockId]) -> None:
        """``_update_req_states``: every group's new blocks join its table; then a window's
        blocks not yet stored that this schedule handed out again (it freed them behind the
        window) become null, so they are never stored (PR #42959, vLLM issue #42761)."""
        ends: dict[str, list[int]] = {}
        for req_id, new_groups in out.new_block_ids.items():
            state = self._requests.get(req_id)
            for g, new_blocks in enumerate(new_groups):
                if state is not None:
                    if g in self._sliding and req_id not in ends:
                        ends[req_id] = [len(state.groups[w].block_ids) for w in self._sliding]
                    state.groups[g].block_ids.extend(new_blocks)
                allocated.update(new_blocks)
        allocated.discard(NULL_BLOCK)
        if not self._sliding or not allocated:
            return
        bpc = self.config.blocks_per_chunk
        for req_id, state in self._requests.items():
            pre = ends.get(req_id)
            for i, g in enumerate(self._sliding):
                table = state.groups[g].block_ids
                for j in range(state.groups[g].next_stored_chunk * bpc, pre[i] if pre else len(table)):
                    if table[j] in allocated:
                        table[j] = NULL_BLOCK

    def _build_stores(self, out: SchedulerOutput, allocated: set[BlockId], flush: set[JobId]) -> list[TransferJob]:
        return self._stores.build(self._requests, out, allocated, flush)

    # ---- reset and checks ---------------------------------------------------------------------

    def reset_cache(self) -> bool:
        answer = super().reset_cache()
        for state in self._requests.values():  # survivors store again from chunk 0
            for group in state.groups:
                group.next_stored_chunk = 0
        return answer

    def check_invariants(self, full: bool = True) -> None:
        if self.fixes.storable_within_allocated:
            for state in self._requests.values() if full else self._cursor_moved:
                for g, group in enumerate(state.groups):
                    assert group.next_stored_chunk <= len(group.offload_keys), f"group {g}: store cursor past the keys"
        super().check_invariants(full)


def connector_scheduler(config: ConnectorConfig, fixes: Fixes | None = None,
                        manager: CPUOffloadManager | None = None) -> ReferenceConnectorScheduler:
    """The reference connector's scheduler side for the configured model."""
    if model_named(config.model).is_dense:
        return ReferenceConnectorScheduler(config, fixes, manager)
    return HybridConnectorScheduler(config, fixes, manager)


__all__ = ["GroupKind", "HybridConnectorScheduler", "connector_scheduler", "group_key", "refresh_group_keys"]
