"""The store half of build_connector_meta for a hybrid model (vLLM 0.32 ``_build_store_jobs``):
one store job per request and step covering every group's chunks.

Per request: the watermark (the same as for one group, ``StorePlanner._offloadable_tokens``), then
per group the chunks from its cursor up to the watermark that are allocated and keyed, minus those
whose last block is null and, for a sliding window, those no later lookup can read
(``KVCacheGroup.reachable_block_mask``: with vLLM's default retention only the window before the
prompt's last token and before a shared-prefix junction). All groups' chunks go to the manager in
one ``prepare_store``; its failure leaves every cursor where it was (retried next step).
A window's source blocks are fenced at once (the engine frees them behind the window while the
request runs); full attention's when the request finishes, as for one group.

A Mamba group (align mode) is never stored from its block table: its running state is rewritten
in place, so a table entry holds a boundary's state only until the next forward. Its cursor
advances with the others', and its states are stored from the engine's hand-off
(``SchedulerOutput.boundary_states``) before the step's other stores, one job per state (vLLM 0.32
``_build_aligned_boundary_store_jobs``; docs/hybrid.md, "The reference connector and Mamba").
vLLM 0.25-0.28 stored it from the block table as a window of one chunk, its blocks packed one after
another in the job (``MambaStores.BLOCK_TABLE``, ``packed_chunks``; docs/hybrid.md, "The releases").
"""

from __future__ import annotations

from kvoffload.core.drafter import storable_chunks
from kvoffload.core.fixes import MambaStores, WindowRules
from kvoffload.core.keys import refresh_group_keys
from kvoffload.core.model import GroupKind, KVCacheGroup
from kvoffload.core.request_state import RequestState
from kvoffload.core.stores import StorePlanner
from kvoffload.core.types import (
    NULL_BLOCK,
    BlockId,
    ConnectorCrash,
    JobId,
    ReqId,
    SchedulerOutput,
    TransferJob,
    TransferKind,
    packed_chunks,
)


def segment_chunks(alignment: int, tpc: int, window: int | None) -> int | None:
    """vLLM 0.25-0.26's ``_alignment_chunk_count``: a group's chunks per full-attention chunk
    where a window is shorter than that, None otherwise (full attention, same sizes)."""
    if window is None or alignment <= tpc or window >= alignment // tpc:
        return None
    return alignment // tpc


class HybridStorePlanner(StorePlanner):
    def __init__(self, config, fixes, manager, jobs, stats, cursor_moved, groups: tuple[KVCacheGroup, ...],
                 touch, chunk_tokens: tuple[int, ...], hashes_per_chunk: tuple[int, ...]):
        super().__init__(config, fixes, manager, jobs, stats, cursor_moved)
        self.groups = groups
        self._touch = touch  # vLLM <= 0.30: the connector's _touch after a store that allocated
        # vLLM <= 0.29 stored a window's segment tails, not the reachable chunks (ReleaseRules.windows)
        self._masked = fixes.rules.windows is WindowRules.REACHABLE_CHUNKS
        self._sliding = [group.kind is GroupKind.SLIDING_WINDOW for group in groups]
        self._mamba = [group.kind is GroupKind.MAMBA for group in groups]
        # vLLM 0.25-0.28 stored a Mamba group from its block table (ReleaseRules.mamba_stores)
        self._mamba_from_table = fixes.rules.mamba_stores is MambaStores.BLOCK_TABLE
        self.drafters: frozenset[int] = frozenset()  # the connector's drafter groups (core/drafter.py)
        self._retention = config.prefix_cache_retention_interval
        self._tpcs, self._hpc = chunk_tokens, hashes_per_chunk  # per group (core/keys.py)
        # Loads are aligned to full attention's chunks: a window's blocks are reachable relative
        # to them (SchedulerOffloadConfig.alignment_tokens; without full attention, the largest
        # chunk). The models here have one full-attention chunk size at most.
        full = [tpc for group, tpc in zip(groups, chunk_tokens) if group.kind is GroupKind.FULL_ATTENTION]
        self._alignment = max(full or chunk_tokens)
        # vLLM 0.25-0.29 (ReleaseRules.windows): per group, its chunks per segment and its window
        # in chunks, None where every chunk is stored (SchedulerOffloadConfig's alignment_chunk_count).
        tails = not self._masked and len(set(full)) == 1
        # 0.27-0.29 end the segment a store's frontier cuts short at that frontier (K15)
        self._frontier_ends = fixes.rules.windows is WindowRules.FRONTIER_TAILS
        self._segments: list[tuple[int, int] | None] = []
        for group, tpc in zip(groups, chunk_tokens):
            window = group.window_chunks(tpc)
            segment = segment_chunks(full[0], tpc, window) if tails else None
            self._segments.append(None if segment is None else (segment, window))

    def build(self, requests: dict[ReqId, RequestState], out: SchedulerOutput, allocated: set[BlockId],
              flush: set[JobId]) -> list[TransferJob]:
        jobs: list[TransferJob] = []
        for req_id, offers in () if self._mamba_from_table else out.boundary_states.items():
            state = requests.get(req_id)
            if state is not None:
                self._store_boundary_states(state, offers, jobs)
        for req_id, num_scheduled in out.num_scheduled_tokens.items():
            state = requests.get(req_id)
            if state is not None:
                self._store_request(state, num_scheduled, allocated, flush, jobs)
        self._store_finished(requests, out, allocated, flush, jobs)
        return jobs

    def _store_boundary_states(self, state: RequestState, offers, jobs: list[TransferJob]) -> None:
        """A Mamba state the engine offers, stored under the key of the chunk ending at its
        boundary, its block fenced from the job's creation (the request frees it a step later
        while the copy may wait). Skipped: a null block, a boundary past what may be offloaded
        (the prompt only, by default) or not at a chunk's end (no lookup can end there)."""
        req = state.req
        max_boundary = min(req.num_tokens, req.num_prompt_tokens) if self.config.offload_prompt_only \
            else req.num_tokens
        refresh_group_keys(state, self._hpc)
        for g, block, boundary in offers:
            if block == NULL_BLOCK or boundary > max_boundary or boundary % self._tpcs[g] or not self._mamba[g]:
                continue
            chunk = boundary // self._tpcs[g] - 1
            key = state.groups[g].offload_keys[chunk]
            prepared = self.manager.prepare_store(req.req_id, [key], [(chunk, g)])
            if prepared is None:
                self.stats.store_allocation_failures += 1
                continue
            if not prepared.keys_to_store:
                continue
            job_id = self.jobs.add_store(req.req_id, (key,), (block,), fence_now=False, fence_early=(block,))
            self.stats.store_jobs += 1
            self.stats.chunks_stored += 1
            jobs.append(TransferJob(job_id, req.req_id, TransferKind.STORE, (block,), tuple(prepared.slots),
                                    (chunk,), chunk_groups=(g,), chunk_skips=(self._bpc - 1,)))

    def _storable(self, state: RequestState, g: int, num_tokens: int) -> int:
        """``storable_chunks``: whole chunks under the watermark, allocated and keyed."""
        group, req = state.groups[g], state.req
        chunks = storable_chunks(num_tokens // self._tpcs[g], g in self.drafters, num_tokens > req.num_prompt_tokens,
                                 req.status.is_finished)
        if self.fixes.storable_within_allocated:
            chunks = min(chunks, len(group.block_ids) // self._bpc, len(group.offload_keys))
        return chunks

    def _store_request(self, state: RequestState, num_scheduled: int, allocated: set[BlockId],
                       flush: set[JobId], jobs: list[TransferJob]) -> None:
        bpc, tpcs = self._bpc, self._tpcs
        req = state.req
        finished = req.status.is_finished
        watermark = self._offloadable_tokens(req, num_scheduled)
        tails: list[tuple[int, int] | None] = [None] * len(tpcs)
        if finished and self._masked:  # the keys first: they bound a group's stored end (_storable)
            refresh_group_keys(state, self._hpc)
            tails = [self._final_tail(req, g, group.next_stored_chunk, self._storable(state, g, watermark))
                     for g, group in enumerate(state.groups)]
        if self._cursor_monotonic and not any(tails) and all(watermark // tpc <= group.next_stored_chunk
                                                              for tpc, group in zip(tpcs, state.groups)):
            return  # the decode step: no group has a chunk to offer (vLLM's loop finds none either)
        refresh_group_keys(state, self._hpc)  # _update_req_states: every scheduled request's keys
        boundaries = () if self._retention is None else (
            (req.num_prompt_tokens - 1, req.shared_prefix_boundary) if req.shared_prefix_boundary
            else (req.num_prompt_tokens - 1,))
        wanted, positions, ranges = [], [], []
        for g, group in enumerate(state.groups):
            cursor, end = group.next_stored_chunk, self._storable(state, g, watermark)
            start = cursor if tails[g] is None else tails[g][0]
            ranges.append((start, end))
            if end <= start or (self._mamba[g] and not self._mamba_from_table):  # only from the hand-off
                continue
            keys = group.offload_keys[start:end]
            last_blocks = group.block_ids[start * bpc + bpc - 1:end * bpc:bpc]
            if len(keys) != len(last_blocks):
                raise ConnectorCrash(  # vLLM's `assert len(offload_keys) == len(offload_block_ids)`
                    f"assert len(offload_keys) == len(block_ids) failed for {req.req_id!r} group {g}: "
                    f"chunks {start}..{end}, {len(keys)} keys, {len(last_blocks)} blocks")
            mask = prompt_mask = None
            if self._masked:
                horizon = self._horizon(req, tpcs[g], end)  # a no-op where the window's chunk is the alignment's
                mask = self.groups[g].reachable_block_mask(start * bpc, end * bpc, tpcs[g] // bpc, self._alignment,
                                                           self._retention, boundaries,
                                                           None if horizon is None else horizon * bpc)
                if tails[g] is not None:  # what the prompt's horizon reached was offered before
                    prompt_mask = self.groups[g].reachable_block_mask(start * bpc, end * bpc, tpcs[g] // bpc,
                                                                      self._alignment, self._retention, boundaries,
                                                                      tails[g][1] * bpc)
            segment = self._segments[g]
            for i, (key, block) in enumerate(zip(keys, last_blocks)):
                if block == NULL_BLOCK or (mask is not None and not any(mask[i * bpc:(i + 1) * bpc])):
                    continue
                if start + i < cursor and (prompt_mask is None or any(prompt_mask[i * bpc:(i + 1) * bpc])):
                    continue
                if segment is not None and not self._in_segment_tail(start + i, end, *segment):
                    continue
                wanted.append(key)
                positions.append((start + i, g))  # recency: by chunk, then group (order_request_keys)
        if not wanted:
            self._advance(state, ranges)
            return
        prepared = self.manager.prepare_store(req.req_id, wanted, positions)
        if prepared is None:  # the tier is full of pending or pinned chunks: every group retries
            self.stats.store_allocation_failures += 1
            return
        if not prepared.keys_to_store:
            self._advance(state, ranges)
            return
        if self._touch_on_access:
            self._touch(state)
        if state.stale_job_ids:
            state.crash_on_stale_jobs("_build_store_jobs")
        slot_of = dict(zip(prepared.keys_to_store, prepared.slots))
        source, early, slots, indices, chunk_groups, skips = [], [], [], [], [], []
        counts: list[int] = []
        for g, ((start, end), group) in enumerate(zip(ranges, state.groups)):
            packs, group_start, first = self._mamba[g], len(slots), 0  # only BLOCK_TABLE stores Mamba here
            for chunk in range(start, end):
                slot = slot_of.get(group.offload_keys[chunk])
                if slot is None:
                    continue
                blocks = group.block_ids[chunk * bpc:(chunk + 1) * bpc]
                held = [block for block in blocks if block != NULL_BLOCK]
                if not packs and blocks[bpc - len(held):] != held:
                    raise ConnectorCrash(f"{req.req_id!r} group {g} chunk {chunk}: a null block amid its blocks")
                if len(slots) == group_start:
                    first = next(i for i, block in enumerate(blocks) if block != NULL_BLOCK)
                source.extend(held)
                if self._sliding[g] or packs:
                    early.extend(held)
                slots.append(slot)
                indices.append(chunk)
                chunk_groups.append(g)
                skips.append(bpc - len(held))
                counts.append(len(held))
            if packs and len(slots) > group_start:
                skips[group_start:], counts[group_start:] = self._packed(req.req_id, g, sum(counts[group_start:]),
                                                                         first, len(slots) - group_start)
            group.next_stored_chunk = max(group.next_stored_chunk, end) if self._cursor_monotonic else end
        self._cursor_moved.append(state)
        job_id = self.jobs.add_store(req.req_id, tuple(prepared.keys_to_store), tuple(source),
                                     fence_now=finished, fence_early=tuple(early))
        if finished and not allocated.isdisjoint(b for b in source if b not in early):
            flush.add(job_id)  # its full-attention blocks were just handed out again (PR #48596)
        self.stats.store_jobs += 1
        self.stats.chunks_stored += len(slots)
        jobs.append(TransferJob(job_id, req.req_id, TransferKind.STORE, tuple(source), tuple(slots),
                                tuple(indices), chunk_groups=tuple(chunk_groups), chunk_skips=tuple(skips),
                                chunk_counts=tuple(counts) if self._mamba_from_table else ()))

    def _in_segment_tail(self, chunk: int, end: int, segment: int, window: int) -> bool:
        """vLLM 0.25-0.29: whether ``chunk`` is among the last ``window`` chunks of its segment,
        the segment whole in 0.25-0.26 (``pos_in_segment``) and cut at the store's end ``end`` in
        0.27-0.29 (``is_store_reachable_swa_chunk``'s ``actual_segment_length``): K15."""
        position = chunk % segment
        length = min(segment, end - (chunk - position)) if self._frontier_ends else segment
        return position >= length - window

    def _final_tail(self, req, g: int, cursor: int, end: int) -> tuple[int, int] | None:
        """vLLM 0.30+'s second look at a finished request's final window tail
        (``_build_store_jobs``' ``reconsider_final_swa_tail``, dense retention): where the stored
        end is not the prompt's horizon (an abort mid-prefill, a decode past it), the chunks of
        its last partial segment the cursor passed while the prompt's horizon left them
        unreachable are offered again. (The store's first chunk, the prompt's horizon) where
        that reaches below the cursor, else None: with one block size the partial segment is
        empty."""
        block_tokens = self._tpcs[g] // self._bpc
        prompt_horizon = min(req.num_prompt_tokens, req.num_tokens) // self._tpcs[g]
        if (not self._sliding[g] or self._retention is not None or end == prompt_horizon
                or self._alignment % block_tokens):
            return None
        per_segment = self._alignment // block_tokens
        start = min(cursor, (end * self._bpc - end * self._bpc % per_segment) // self._bpc)
        return (start, prompt_horizon) if start < min(cursor, end) else None

    def _horizon(self, req, tpc: int, end: int) -> int | None:
        """The chunk where the request's final segment ends, whose window tail a later hit on
        the whole prompt reads (vLLM 0.32 ``_build_store_jobs``' ``store_horizon_chunks``, vLLM
        #54362, 0.30+): the stored end once finished, the prompt's while a prefill step stores
        below it; None under a retention interval (its boundaries say) or past the prompt (a
        decode frontier is no final boundary); :meth:`_final_tail` looks again at a finished
        request's final tail."""
        if self._retention is not None:
            return None
        if req.status.is_finished:
            return end
        prompt_chunks = min(req.num_prompt_tokens, req.num_tokens) // tpc
        return prompt_chunks if end <= prompt_chunks else None

    def _packed(self, req_id: ReqId, g: int, num_blocks: int, first: int, num_chunks: int):
        """vLLM 0.25-0.28's layout of a Mamba group's blocks in its ``num_chunks`` slots
        (:func:`packed_chunks`); a layout needing another number of slots fails the worker's
        ``assert dst_offset == num_dst_blocks`` (cpu/gpu_worker.py, ``transfer_async``)."""
        layout = packed_chunks(num_blocks, first, self._bpc)
        if len(layout[0]) != num_chunks:
            raise ConnectorCrash(f"{req_id!r} group {g}: {num_blocks} blocks packed from sub-block {first} fill "
                                 f"{len(layout[0])} chunks, {num_chunks} given (assert dst_offset == num_dst_blocks)")
        return layout

    def _advance(self, state: RequestState, ranges: list[tuple[int, int]]) -> None:
        """``advance_stored_idx``: nothing to store below the watermark, in any group (vLLM 0.25
        assigned the cursor, ``ReleaseRules.store_cursor_monotonic``)."""
        for group, (_, end) in zip(state.groups, ranges):
            group.next_stored_chunk = max(group.next_stored_chunk, end) if self._cursor_monotonic else end
        self._cursor_moved.append(state)
