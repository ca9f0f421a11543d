"""The reference connector's scheduler side: what to load, what to store, and when to let go.

The engine calls, per step and in vLLM's order (DESIGN.md, "One engine step"):

    on_new_request(req)                          when a request is added
    get_num_new_matched_tokens(req, n_local)     admitting a waiting request -> (hit tokens | None, async)
    update_state_after_alloc(req, blocks, n_ext) after its blocks were allocated
    build_connector_meta(sched_out) -> StepPlan  end of schedule(), before computed counters advance
    request_finished(req, block_ids)             in update_from_output, right before blocks are freed
    update_connector_output(results)             after update_from_output's per-request loop
    reset_cache(), has_pending_work()

Every rule that an earlier vLLM release got wrong sits behind a flag of :class:`Fixes`; with a
flag off the code takes the old path on purpose, so a test can replay the historical bug.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from kvoffload.core.fixes import Fixes
from kvoffload.core.jobs import JobRegistry
from kvoffload.core.manager import CPUOffloadManager, LookupResult
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
    StepPlan,
    TransferJob,
    TransferKind,
    TransferResult,
    cdiv,
)


@dataclass(slots=True)
class _RequestState:
    """What the connector remembers of one request, from on_new_request until released."""

    req: RequestView
    offload_keys: list[OffloadKey] = field(default_factory=list)  # key of chunk i
    block_ids: list[BlockId] = field(default_factory=list)  # the request's GPU block table
    next_stored_chunk: int = 0  # chunks below were stored, skipped or hit
    num_local_tokens: int = 0  # GPU prefix-cache hit tokens at the last admission
    finish_signalled: bool = False  # manager.on_request_finished was called
    load_destination: tuple[BlockId, ...] = ()  # GPU blocks its load in flight writes
    # Only with reset_clears_request_jobs off: job ids reset_cache forgot to clear (vLLM #48102).
    stale_job_ids: tuple[JobId, ...] = ()


@dataclass
class SchedulerStats:
    lookups: int = 0  # lookups that returned a result (deferrals excluded)
    deferred_lookups: int = 0
    queried_tokens: int = 0  # tokens the connector was asked to serve
    hit_tokens: int = 0
    load_jobs: int = 0
    store_jobs: int = 0
    chunks_stored: int = 0  # chunks handed to a store job
    store_allocation_failures: int = 0
    flushed_jobs: int = 0


class ReferenceConnectorScheduler:
    def __init__(self, config: ConnectorConfig, fixes: Fixes | None = None,
                 manager: CPUOffloadManager | None = None):
        self.config = config
        self.fixes = fixes if fixes is not None else Fixes()
        self.manager = manager if manager is not None else CPUOffloadManager(
            config.cpu_chunks, config.strict_lifecycle, config.raise_on_violation)
        self.jobs = JobRegistry(num_workers=config.num_workers)
        self.stats = SchedulerStats()
        self._requests: dict[ReqId, _RequestState] = {}
        self._chunks_being_loaded: set[OffloadKey] = set()
        self._failed_jobs: set[JobId] = set()
        # Failed loads' GPU blocks (vLLM: get_block_ids_with_load_errors -> _handle_invalid_blocks)
        self._load_error_blocks: set[BlockId] = set()
        # Flushes requested by reset_cache, delivered with the next plan.
        self._flush_next_plan: set[JobId] = set()
        # Per-schedule scratch, emptied at the end of build_connector_meta.
        self._load_jobs_this_step: list[TransferJob] = []
        self._allocated_this_step: set[BlockId] = set()

    # ---- request lifecycle ----------------------------------------------------------------

    def on_new_request(self, req: RequestView) -> None:
        state = _RequestState(req)
        self._requests[req.req_id] = state
        self.manager.on_new_request(req.req_id)
        self._refresh_keys(state)

    def _refresh_keys(self, state: _RequestState) -> None:
        """Key of chunk i = hash of the chunk's last GPU block (hashes are chained)."""
        hashes = state.req.block_hashes
        keys = state.offload_keys
        bpc = self.config.blocks_per_chunk
        for last_block in range((len(keys) + 1) * bpc - 1, len(hashes), bpc):
            keys.append(hashes[last_block])

    # ---- admission: lookup and load -------------------------------------------------------

    def get_num_new_matched_tokens(self, req: RequestView, num_local_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond ``num_local_tokens`` the offload tier can supply (loaded asynchronously).

        None means "ask again next step": a chunk is still being written, being loaded by another
        request, or this request still has transfers in flight.
        """
        state = self._requests[req.req_id]
        state.block_ids.clear()  # admission: the whole block table follows in this step's output
        if self._has_jobs(state) and self.fixes.defer_lookup_while_transferring:
            self.stats.deferred_lookups += 1
            return None, False
        self._refresh_keys(state)
        state.num_local_tokens = num_local_tokens
        tpc = self.config.tokens_per_chunk
        first_chunk = num_local_tokens // tpc
        end_chunk = min(req.num_tokens, len(state.offload_keys) * tpc) // tpc
        if end_chunk <= first_chunk:
            return 0, False
        hit_chunks, pending = 0, False
        for key in state.offload_keys[first_chunk:end_chunk]:
            result = self.manager.lookup(key)
            if result is LookupResult.MISS:
                break
            pending |= result is LookupResult.HIT_PENDING
            hit_chunks += 1
        hit_keys = state.offload_keys[first_chunk:first_chunk + hit_chunks]
        if pending or not self._chunks_being_loaded.isdisjoint(hit_keys):
            self.stats.deferred_lookups += 1
            return None, False
        hits = (first_chunk + hit_chunks) * tpc - num_local_tokens if hit_chunks else 0
        self.stats.lookups += 1
        self.stats.queried_tokens += end_chunk * tpc - num_local_tokens
        self.stats.hit_tokens += hits
        self.manager.touch(state.offload_keys)
        return hits, hits > 0

    def update_state_after_alloc(self, req: RequestView, block_ids: Sequence[BlockId], num_external_tokens: int) -> None:
        """Blocks are allocated for an admitted request; with external hits, build its load job."""
        if num_external_tokens == 0:
            return
        state = self._requests[req.req_id]
        cfg = self.config
        self._allocated_this_step.update(b for b in block_ids if b != NULL_BLOCK)
        num_cached = state.num_local_tokens + num_external_tokens
        local_blocks = state.num_local_tokens // cfg.block_size
        first_chunk = local_blocks // cfg.blocks_per_chunk
        end_chunk = cdiv(num_cached, cfg.tokens_per_chunk)
        keys = tuple(state.offload_keys[first_chunk:end_chunk])
        destination = tuple(block_ids[local_blocks:cdiv(num_cached, cfg.block_size)])
        state.next_stored_chunk = end_chunk  # hit chunks are not stored again
        if self._has_jobs(state):
            # Only reachable with defer_lookup_while_transferring off (vLLM issue #46014).
            raise ConnectorCrash(f"assert not transfer_jobs: load for {req.req_id!r} while it has jobs in flight")
        slots = self.manager.prepare_load(req.req_id, keys)
        job_id = self.jobs.add_load(req.req_id, keys)
        state.load_destination = destination
        self._chunks_being_loaded.update(keys)
        self.stats.load_jobs += 1
        self._load_jobs_this_step.append(TransferJob(
            job_id=job_id, req_id=req.req_id, kind=TransferKind.LOAD, gpu_block_ids=destination,
            chunk_slots=slots, chunk_indices=tuple(range(first_chunk, end_chunk)),
            skip_blocks=local_blocks % cfg.blocks_per_chunk))

    # ---- the plan of one step -------------------------------------------------------------

    def build_connector_meta(self, out: SchedulerOutput) -> StepPlan:
        allocated = self._allocated_this_step
        for req_id, new_blocks in out.new_block_ids.items():
            state = self._requests.get(req_id)
            if state is not None:
                state.block_ids.extend(new_blocks)
            allocated.update(new_blocks)
        allocated.discard(NULL_BLOCK)

        flush = self._flush_next_plan
        for req_id in out.preempted_req_ids:  # their blocks are freed: every store must land first
            flush.update(self.jobs.jobs_of(req_id))
        # The fence: a block handed out in this schedule may still be read by a pending store.
        flush.update(self.jobs.stores_reading(allocated))

        store_jobs = self._build_store_jobs(out, allocated, flush)
        plan = StepPlan(tuple(self._load_jobs_this_step), tuple(store_jobs), frozenset(flush))
        self.stats.flushed_jobs += len(flush)

        if self.fixes.deferred_finish_signal:
            # PR #49671: the manager hears "finished" only once the final stores exist.
            for req_id in out.finished_req_ids:
                state = self._requests.get(req_id)
                if state is None:
                    continue
                if not state.finish_signalled:
                    state.finish_signalled = True
                    self.manager.on_request_finished(req_id)
                self._release_if_done(state)
        else:
            for req_id in out.finished_req_ids:  # vLLM 0.26's cleanup of finished requests
                state = self._requests.get(req_id)
                if state is not None:
                    self._release_if_done(state)

        self._flush_next_plan = set()
        self._load_jobs_this_step = []
        self._allocated_this_step = set()
        return plan

    def _build_store_jobs(self, out: SchedulerOutput, allocated: set[BlockId], flush: set[JobId]) -> list[TransferJob]:
        tpc = self.config.tokens_per_chunk
        requests = self._requests
        jobs: list[TransferJob] = []
        for req_id, num_scheduled in out.num_scheduled_tokens.items():
            state = requests.get(req_id)
            if state is None:
                continue
            req = state.req
            # Fast path, the common decode step: the watermark, min(computed + scheduled,
            # num_tokens), stays short of the end of the next chunk to store.
            boundary = (state.next_stored_chunk + 1) * tpc
            if req.num_computed_tokens + num_scheduled < boundary or len(req.all_token_ids) < boundary:
                continue
            self._store_request(state, num_scheduled, allocated, flush, jobs)
        if self.fixes.last_block_at_finish:  # PR #48596: finished requests get their last store
            for req_id in out.finished_req_ids:
                state = requests.get(req_id)
                if state is not None:
                    self._store_request(state, 0, allocated, flush, jobs)
        return jobs

    def _store_request(self, state: _RequestState, num_scheduled: int, allocated: set[BlockId],
                       flush: set[JobId], jobs: list[TransferJob]) -> None:
        """Offer the request's chunks from its cursor up to its watermark to the manager; on
        success append the store job (and flush it if its blocks were just handed out)."""
        cfg, fixes = self.config, self.fixes
        bpc, tpc = cfg.blocks_per_chunk, cfg.tokens_per_chunk
        req = state.req
        req_id = req.req_id
        start = state.next_stored_chunk
        num_chunks = self._offloadable_tokens(req, num_scheduled) // tpc
        if num_chunks <= start:
            return
        finished = req.status.is_finished
        self._refresh_keys(state)
        if fixes.storable_within_allocated:
            num_chunks = min(num_chunks, len(state.block_ids) // bpc, len(state.offload_keys))
            if num_chunks <= start:
                return
        keys = state.offload_keys[start:num_chunks]
        last_blocks = state.block_ids[start * bpc + bpc - 1:num_chunks * bpc:bpc]
        if not len(keys) == len(last_blocks) == num_chunks - start:
            # vLLM's `assert len(offload_keys) == len(block_ids)` (#49118, #52170): fatal.
            raise ConnectorCrash(
                f"assert len(offload_keys) == len(block_ids) failed for {req_id!r}: chunks "
                f"{start}..{num_chunks}, {len(keys)} keys, {len(last_blocks)} blocks")
        wanted = [(chunk, key) for chunk, (key, block) in enumerate(zip(keys, last_blocks), start)
                  if block != NULL_BLOCK]
        if not wanted:
            state.next_stored_chunk = num_chunks
            return
        wanted_keys = [key for _, key in wanted]
        prepared = self.manager.prepare_store(req_id, wanted_keys)
        if prepared is None:  # tier full of pending or pinned chunks: retry next step
            self.stats.store_allocation_failures += 1
            return
        state.next_stored_chunk = num_chunks
        if not prepared.keys_to_store:
            return
        self.manager.touch(wanted_keys)
        if len(prepared.keys_to_store) == num_chunks - start:  # the usual case: every chunk is new
            source = tuple(state.block_ids[start * bpc:num_chunks * bpc])
            slots = prepared.slots
            chunk_indices = tuple(range(start, num_chunks))
        else:
            slot_of = dict(zip(prepared.keys_to_store, prepared.slots))
            stored = [(chunk, slot_of[key]) for chunk, key in wanted if key in slot_of]
            source = tuple(b for chunk, _ in stored for b in state.block_ids[chunk * bpc:(chunk + 1) * bpc])
            slots = tuple(slot for _, slot in stored)
            chunk_indices = tuple(chunk for chunk, _ in stored)
        job_id = self.jobs.add_store(req_id, prepared.keys_to_store, source, fence_now=finished)
        if finished and not allocated.isdisjoint(source):
            flush.add(job_id)  # its blocks were just handed out again (PR #48596)
        self.stats.store_jobs += 1
        self.stats.chunks_stored += len(slots)
        jobs.append(TransferJob(job_id, req_id, TransferKind.STORE, source, slots, chunk_indices))

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

    # ---- finish, completions, reset -------------------------------------------------------

    def request_finished(self, req: RequestView, block_ids: Sequence[BlockId] = ()) -> bool:
        """The request stopped or was aborted; its blocks are freed right after this returns.

        Always returns False: blocks are freed at once, in-flight stores are fenced instead.
        """
        state = self._requests.get(req.req_id)
        if state is None:  # never tracked: announce and finish back to back
            self.manager.on_new_request(req.req_id)
            self.manager.on_request_finished(req.req_id)
            return False
        if self.fixes.last_block_at_finish:
            self._refresh_keys(state)  # the final tokens may have completed a chunk's hash
        self.jobs.fence_request(req.req_id)
        if not self.fixes.deferred_finish_signal:
            # vLLM <= 0.26: signalled before the final store is even built (issue #49635).
            state.finish_signalled = True
            self.manager.on_request_finished(req.req_id)
            if not self.fixes.last_block_at_finish:
                self._release_if_done(state)  # vLLM <= 0.25: forgotten at once when idle
        return False

    def update_connector_output(self, results: Iterable[TransferResult]) -> None:
        for result in results:
            if self.jobs.is_stale(result.job_id):
                continue  # created before reset_cache: its state is gone
            if not result.success:
                self._failed_jobs.add(result.job_id)
            done = self.jobs.acknowledge(result.job_id)
            if done is None:
                continue
            succeeded = done.job_id not in self._failed_jobs
            self._failed_jobs.discard(done.job_id)
            if done.is_store:
                self.manager.complete_store(done.keys, success=succeeded)
            else:
                self.manager.complete_load(done.keys)
                self._chunks_being_loaded.difference_update(done.keys)
            state = self._requests.get(done.req_id)
            if state is None:
                raise ConnectorCrash(f"KeyError: completion of job {done.job_id} for released request {done.req_id!r}")
            if not done.is_store and not succeeded:  # garbage in its blocks: the engine recomputes
                self._load_error_blocks.update(state.load_destination)
            self._release_if_done(state)

    def take_block_ids_with_load_errors(self) -> set[BlockId]:
        """GPU blocks of loads that failed since the last call (each reported once)."""
        blocks, self._load_error_blocks = self._load_error_blocks, set()
        return blocks

    def _has_jobs(self, state: _RequestState) -> bool:
        return bool(state.stale_job_ids) or self.jobs.has_jobs(state.req.req_id)

    def _release_if_done(self, state: _RequestState) -> None:
        if self._has_jobs(state):
            return
        if self.fixes.deferred_finish_signal:
            done = state.finish_signalled
        else:
            done = state.req.status.is_finished
        if done:
            del self._requests[state.req.req_id]

    def reset_cache(self) -> bool:
        """Drop every offloaded chunk. In-flight jobs are flushed with the next plan; their
        completions arrive as stale and are ignored."""
        assert not self._load_jobs_this_step and not self._allocated_this_step, "reset_cache mid-step"
        jobs_by_request = {req_id: self.jobs.jobs_of(req_id) for req_id in self._requests}
        self._flush_next_plan.update(self.jobs.drop_all())
        self._chunks_being_loaded.clear()
        self._failed_jobs.clear()
        for req_id, state in list(self._requests.items()):
            if state.req.status.is_finished:
                if not state.finish_signalled:
                    state.finish_signalled = True
                    self.manager.on_request_finished(req_id)
                del self._requests[req_id]
                continue
            state.next_stored_chunk = 0
            if not self.fixes.reset_clears_request_jobs:
                state.stale_job_ids = state.stale_job_ids + jobs_by_request[req_id]
        self.manager.reset_cache()
        return True

    def has_pending_work(self) -> bool:
        return bool(len(self.jobs) or self._flush_next_plan or self.manager.has_pending_work())

    # ---- introspection --------------------------------------------------------------------

    def tracked_request_ids(self) -> tuple[ReqId, ...]:
        return tuple(self._requests)

    def next_stored_chunk(self, req_id: ReqId) -> int:
        return self._requests[req_id].next_stored_chunk

    def check_invariants(self, full: bool = True) -> None:
        """I1-I4 over the job indexes (cost: jobs in flight); ``full`` adds O(capacity) checks."""
        self.jobs.check_invariants()
        self.manager.check_invariants(full)
        for req_id in self.jobs.request_ids():
            assert req_id in self._requests, f"I3: {req_id!r} has jobs but no state"
        if self.fixes.storable_within_allocated:
            for state in self._requests.values():
                assert state.next_stored_chunk <= len(state.offload_keys), "store cursor past the known keys"
