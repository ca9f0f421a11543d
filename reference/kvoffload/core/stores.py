"""The store half of build_connector_meta: which chunks each request offers the tier this step.

A running request offers the chunks between its cursor and its watermark (the tokens whose KV
a forward pass has written, or writes in this step); a finished one its last chunks, once. The
fix flags that shaped this path (watermarks, the allocated-block clamp, the finish pass) and the
release rules (vLLM <= 0.30's touch, 0.25's rewinding cursor) are explained in docs/design.md.
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.core.fixes import Fixes, Recency
from kvoffload.core.jobs import JobRegistry
from kvoffload.core.manager import CPUOffloadManager
from kvoffload.core.request_state import RequestState, SchedulerStats
from kvoffload.core.types import (
    NULL_BLOCK,
    BlockId,
    ConnectorConfig,
    ConnectorCrash,
    JobId,
    OffloadKey,
    ReqId,
    RequestStatus,
    RequestView,
    SchedulerOutput,
    TransferJob,
    TransferKind,
)

_STORE = TransferKind.STORE


class StorePlanner:
    def __init__(self, config: ConnectorConfig, fixes: Fixes, manager: CPUOffloadManager, jobs: JobRegistry,
                 stats: SchedulerStats, cursor_moved: list[RequestState]):
        self.config, self.fixes, self.manager, self.jobs, self.stats = config, fixes, manager, jobs, stats
        self._cursor_moved = cursor_moved  # states whose cursor moved: the connector's per-step check
        # vLLM <= 0.30's _touch: a store that allocated moves all the request's keys to the
        # recent end. From 0.31 the manager ranks on its own; the connector never touches.
        self._touch_on_access = manager.recency is Recency.TOUCH_ON_ACCESS
        self._cursor_monotonic = fixes.rules.store_cursor_monotonic
        self._bpc, self._tpc = config.blocks_per_chunk, config.tokens_per_chunk  # read per store
        self._prompt_only = config.offload_prompt_only

    def build(self, requests: dict[ReqId, RequestState], out: SchedulerOutput, allocated: set[BlockId],
              flush: set[JobId]) -> list[TransferJob]:
        """This step's store jobs: scheduled requests, then (PR #48596) the finished ones."""
        jobs: list[TransferJob] = []
        state_of = requests.get
        if self._cursor_monotonic:
            # The common decode step: the watermark, min(computed + scheduled, num_tokens), stays
            # short of the end of the next chunk to store. Nothing to do: one comprehension
            # filters those out (it runs over every scheduled request, every step).
            due = [(state, num_scheduled) for req_id, num_scheduled in out.num_scheduled_tokens.items()
                   if (state := state_of(req_id)) is not None
                   and state.req.num_computed_tokens + num_scheduled >= state.store_boundary
                   and len(state.req.all_token_ids) >= state.store_boundary]
            for state, num_scheduled in due:
                self._store_request(state, num_scheduled, allocated, flush, jobs)
        else:  # a rewinding cursor (vLLM 0.25) must see every request, behind its cursor or not
            for req_id, num_scheduled in out.num_scheduled_tokens.items():
                state = state_of(req_id)
                if state is not None:
                    self._store_request(state, num_scheduled, allocated, flush, jobs)
        self._store_finished(requests, out, allocated, flush, jobs)
        return jobs

    def _store_finished(self, requests: dict[ReqId, RequestState], out: SchedulerOutput, allocated: set[BlockId],
                        flush: set[JobId], jobs: list[TransferJob]) -> None:
        """PR #48596: each request that finished this step gets its last store (into ``jobs``)."""
        if self.fixes.last_block_at_finish:
            for req_id in out.finished_req_ids:
                state = requests.get(req_id)
                if state is not None:
                    self._store_request(state, 0, allocated, flush, jobs)

    def _store_request(self, state: RequestState, num_scheduled: int, allocated: set[BlockId],
                       flush: set[JobId], jobs: list[TransferJob]) -> None:
        """Offer the request's chunks from its cursor up to its watermark to the manager; on
        success append the store job (and flush it if its blocks were just handed out)."""
        bpc, tpc = self._bpc, self._tpc
        req = state.req
        req_id = req.req_id
        start = state.next_stored_chunk
        finished = req.status.is_finished
        if finished or self._prompt_only:
            num_chunks = self._offloadable_tokens(req, num_scheduled) // tpc
        else:  # running: min(computed + scheduled, num_tokens), inlined for the decode step
            num_chunks = min(req.num_computed_tokens + num_scheduled, len(req.all_token_ids)) // tpc
        if num_chunks <= start:
            if not self._cursor_monotonic:
                # vLLM 0.25's advance_stored_idx assigned: after a preemption the prefill's
                # watermark is below the cursor and pulls it back (0.26 takes the max).
                state.move_cursor(num_chunks, tpc)
                self._cursor_moved.append(state)
            return
        offload_keys = state.offload_keys
        if (len(offload_keys) + 1) * bpc <= len(req.block_hashes):
            state.refresh_keys(bpc)
        block_ids = state.block_ids
        if self.fixes.storable_within_allocated:
            num_chunks = min(num_chunks, len(block_ids) // bpc, len(offload_keys))
            if num_chunks <= start:
                return
        count = num_chunks - start
        if count == 1 and len(offload_keys) > start and len(block_ids) >= num_chunks * bpc:
            # The decode step: one chunk completed. Same checks as below, without the slices.
            if block_ids[num_chunks * bpc - 1] == NULL_BLOCK:
                state.move_cursor(num_chunks, tpc)
                self._cursor_moved.append(state)
                return
            keys: list[OffloadKey] = [offload_keys[start]]
            positions: Sequence[int] = (start,)
        else:
            keys = offload_keys[start:num_chunks]
            last_blocks = block_ids[start * bpc + bpc - 1:num_chunks * bpc:bpc]
            if not len(keys) == len(last_blocks) == count:
                # vLLM's `assert len(offload_keys) == len(block_ids)` (#49118, #52170): fatal.
                raise ConnectorCrash(
                    f"assert len(offload_keys) == len(block_ids) failed for {req_id!r}: chunks "
                    f"{start}..{num_chunks}, {len(keys)} keys, {len(last_blocks)} blocks")
            if NULL_BLOCK in last_blocks:  # only after a reset or a partial hit: skip those chunks
                wanted = [(chunk, key) for chunk, (key, block) in enumerate(zip(keys, last_blocks), start)
                          if block != NULL_BLOCK]
                if not wanted:
                    state.move_cursor(num_chunks, tpc)
                    self._cursor_moved.append(state)
                    return
                keys = [key for _, key in wanted]
                positions = [chunk for chunk, _ in wanted]
            else:
                positions = range(start, num_chunks)
        prepared = self.manager.prepare_store(req_id, keys, positions)
        if prepared is None:  # tier full of pending or pinned chunks: retry next step
            self.stats.store_allocation_failures += 1
            return
        state.move_cursor(num_chunks, tpc)
        self._cursor_moved.append(state)
        keys_to_store = prepared.keys_to_store
        if not keys_to_store:
            return
        if self._touch_on_access:  # vLLM <= 0.30: a store that allocated touches every key
            self.manager.touch(state.offload_keys)
        if state.stale_job_ids:
            state.crash_on_stale_jobs("_build_store_jobs")
        if len(keys_to_store) == count:  # the usual case: every chunk is new
            source = tuple(block_ids[start * bpc:num_chunks * bpc])
            slots = prepared.slots
            chunk_indices = tuple(positions)
        else:
            slot_of = dict(zip(keys_to_store, prepared.slots))
            stored = [(chunk, slot_of[key]) for chunk, key in zip(positions, keys) if key in slot_of]
            source = tuple(b for chunk, _ in stored for b in block_ids[chunk * bpc:(chunk + 1) * bpc])
            slots = tuple(slot for _, slot in stored)
            chunk_indices = tuple(chunk for chunk, _ in stored)
        job_id = self.jobs.add_store(req_id, keys_to_store, source, fence_now=finished)
        if finished and not allocated.isdisjoint(source):
            flush.add(job_id)  # its blocks were just handed out again (PR #48596)
        stats = self.stats
        stats.store_jobs += 1
        stats.chunks_stored += len(slots)
        jobs.append(TransferJob(job_id, req_id, _STORE, source, slots, chunk_indices))

    def _offloadable_tokens(self, req: RequestView, num_scheduled: int) -> int:
        """The store watermark: tokens whose KV a forward pass has written (or will this step)."""
        status = req.status
        if status is RequestStatus.FINISHED_ABORTED and self.fixes.aborted_watermark:
            watermark = req.num_computed_tokens  # PR #49285
        elif status.is_finished:
            if self.fixes.final_token_watermark:  # PR #54288: the last token's slot is unwritten
                watermark = max(req.num_prompt_tokens, req.num_tokens - 1)
            else:
                watermark = req.num_tokens
        else:
            watermark = req.num_computed_tokens + num_scheduled
        watermark = min(watermark, req.num_tokens)
        if self.config.offload_prompt_only:
            watermark = min(watermark, req.num_prompt_tokens)
        return watermark
