"""The reference connector's scheduler side: what to load, what to store, and when to let go.

The engine calls, per step and in vLLM's order (docs/engine.md, "One engine step"):

    on_new_request(req)                          when a request is added
    get_num_new_matched_tokens(req, n_local)     admitting a waiting request -> (hit tokens | None, async)
    update_state_after_alloc(req, blocks, n_ext) after its blocks were allocated
    build_connector_meta(sched_out) -> StepPlan  end of schedule(), before computed counters advance
    request_finished(req, block_ids)             in update_from_output, right before blocks are freed
    update_connector_output(results)             after update_from_output's per-request loop
    reset_cache(), has_pending_work()

Every rule that an earlier vLLM release got wrong sits behind a flag of :class:`Fixes`; with a
flag off the code takes the old path on purpose, so a test can replay the historical bug. Rules
that changed between releases without being a bug (recency, the store cursor) come from
``Fixes.rules`` (docs/design.md, "Connector rules"). The store half of build_connector_meta lives
in stores.py, the per-request state in request_state.py.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from kvoffload.core.fixes import Fixes, Recency
from kvoffload.core.jobs import JobRegistry
from kvoffload.core.manager import CPUOffloadManager, LookupResult
from kvoffload.core.request_state import RequestState, SchedulerStats
from kvoffload.core.stores import StorePlanner
from kvoffload.core.types import (
    NULL_BLOCK,
    BlockId,
    ConnectorConfig,
    ConnectorCrash,
    JobId,
    OffloadKey,
    ReqId,
    RequestView,
    SchedulerOutput,
    StepPlan,
    TransferJob,
    TransferKind,
    TransferResult,
    cdiv,
)


# Moved store cursors remembered between invariant checks, at most (then every cursor is checked).
MOVED_KEPT = 4096


class ReferenceConnectorScheduler:
    def __init__(self, config: ConnectorConfig, fixes: Fixes | None = None,
                 manager: CPUOffloadManager | None = None):
        self.config = config
        self.fixes = fixes if fixes is not None else Fixes()
        self.manager = manager if manager is not None else CPUOffloadManager(
            config.cpu_chunks, config.strict_lifecycle, config.raise_on_violation, self.fixes.rules.recency)
        # vLLM <= 0.30's _touch: after every lookup (and every store, see stores.py), all the
        # request's keys. From 0.31 the manager ranks on its own; the connector never touches.
        self._touch_on_access = self.manager.recency is Recency.TOUCH_ON_ACCESS
        self._tokens_per_chunk = config.tokens_per_chunk
        self.jobs = JobRegistry(num_workers=config.num_workers)
        self.stats = SchedulerStats()
        # Store cursors moved since the last invariant check (the per-step check looks at these
        # only: elsewhere a cursor only goes back to chunk 0). Bounded: past MOVED_KEPT, all next time.
        self._cursor_moved: list[RequestState] = []
        self._check_every_cursor = False
        self._stores = StorePlanner(config, self.fixes, self.manager, self.jobs, self.stats, self._cursor_moved)
        self._requests: dict[ReqId, RequestState] = {}
        self._chunks_being_loaded: set[OffloadKey] = set()
        self._failed_jobs: set[JobId] = set()
        # Flushes requested by reset_cache, delivered with the next plan.
        self._flush_next_plan: set[JobId] = set()
        # Per-schedule scratch, emptied at the end of build_connector_meta.
        self._load_jobs_this_step: list[TransferJob] = []
        self._allocated_this_step: set[BlockId] = set()

    # ---- request lifecycle ----------------------------------------------------------------

    def on_new_request(self, req: RequestView) -> None:
        state = RequestState(req)
        state.move_cursor(0, self._tokens_per_chunk)
        self._requests[req.req_id] = state
        self.manager.on_new_request(req.req_id)
        self._refresh_keys(state)

    # Hooks a hybrid model's connector (core/hybrid.py) overrides: the request's keys and blocks
    # are per KV cache group there.

    def _refresh_keys(self, state: RequestState) -> None:
        state.refresh_keys(self.config.blocks_per_chunk)

    def _clear_blocks(self, state: RequestState) -> None:
        state.block_ids.clear()

    def _touch(self, state: RequestState, hit_end: int | None = None) -> None:
        self.manager.touch(state.offload_keys)

    # ---- admission: lookup and load -------------------------------------------------------

    def get_num_new_matched_tokens(self, req: RequestView, num_local_tokens: int) -> tuple[int | None, bool]:
        """Tokens beyond ``num_local_tokens`` the offload tier can supply (loaded asynchronously).

        None means "ask again next step": a chunk is still being written, being loaded by another
        request, or this request still has transfers in flight.
        """
        state = self._requests[req.req_id]
        self._clear_blocks(state)  # admission: the whole block table follows in this step's output
        if self._has_jobs(state) and self.fixes.defer_lookup_while_transferring:
            self.stats.deferred_lookups += 1
            return None, False
        self._refresh_keys(state)
        state.num_local_tokens = num_local_tokens
        hits = self._lookup(state, num_local_tokens)
        if self._touch_on_access:  # vLLM <= 0.30 touched after deferred and zero-hit lookups too
            self._touch(state, num_local_tokens + (hits or 0))
        if hits is None:
            self.stats.deferred_lookups += 1
            return None, False
        return hits, hits > 0

    def _lookup(self, state: RequestState, num_local_tokens: int) -> int | None:
        """Whole chunks past ``num_local_tokens`` the tier holds, as tokens; None: ask again.

        vLLM's complete-chunk rule (``_lookup_complete_chunks``, every release modelled): a hit
        that would add less than one whole chunk of tokens beyond the GPU prefix hit reports 0.
        With blocks_per_chunk > 1 the GPU hit may end mid-chunk; the first hit chunk then only
        adds its tail, and a lone chunk whose tail is shorter than a chunk is not worth a load.
        """
        tpc = self.config.tokens_per_chunk
        keyed_end = min(state.req.num_tokens, len(state.offload_keys) * tpc)
        if keyed_end - num_local_tokens < tpc:
            return 0  # not even one whole chunk could be loaded: no query at all
        first_chunk = num_local_tokens // tpc
        end_chunk = keyed_end // tpc
        hit_chunks, pending = 0, False
        lookup, MISS, PENDING = self.manager.lookup, LookupResult.MISS, LookupResult.HIT_PENDING
        keys = state.offload_keys
        for index in range(first_chunk, end_chunk):  # no slice: the walk usually stops early
            result = lookup(keys[index])
            if result is MISS:
                break
            pending |= result is PENDING
            hit_chunks += 1
        if pending:
            return None
        hits = (first_chunk + hit_chunks) * tpc - num_local_tokens
        if hits < tpc:
            hits = 0
        elif not self._chunks_being_loaded.isdisjoint(state.offload_keys[first_chunk:first_chunk + hit_chunks]):
            return None
        self.stats.lookups += 1
        self.stats.queried_tokens += end_chunk * tpc - num_local_tokens
        self.stats.hit_tokens += hits
        return hits

    def update_state_after_alloc(self, req: RequestView, block_ids: Sequence[BlockId], num_external_tokens: int) -> None:
        """Blocks are allocated for an admitted request; with external hits, build its load job.

        Every allocation is recorded for the fence first, hits or not: beside another connector
        (vLLM's MultiConnector) a request can be handed blocks that the other one writes, with
        zero external tokens here and in no scheduler output until its load lands (catalogue
        K13, vLLM #46951, still open in 0.32; docs/design.md, "Connector rules")."""
        self._allocated_this_step.update(b for b in block_ids if b != NULL_BLOCK)
        if num_external_tokens == 0:
            return
        state = self._requests[req.req_id]
        cfg = self.config
        num_cached = state.num_local_tokens + num_external_tokens
        local_blocks = state.num_local_tokens // cfg.block_size
        first_chunk = local_blocks // cfg.blocks_per_chunk
        end_chunk = cdiv(num_cached, cfg.tokens_per_chunk)
        keys = tuple(state.offload_keys[first_chunk:end_chunk])
        destination = tuple(block_ids[local_blocks:cdiv(num_cached, cfg.block_size)])
        state.move_cursor(end_chunk, self._tokens_per_chunk)  # hit chunks are not stored again
        self._cursor_moved.append(state)
        if self._has_jobs(state):
            # Only reachable with defer_lookup_while_transferring off (vLLM issue #46014).
            raise ConnectorCrash(f"assert not transfer_jobs: load for {req.req_id!r} while it has jobs in flight")
        slots = self.manager.prepare_load(req.req_id, keys, range(first_chunk, end_chunk))
        job_id = self.jobs.add_load(req.req_id, keys)
        self._chunks_being_loaded.update(keys)
        self.stats.load_jobs += 1
        self._load_jobs_this_step.append(TransferJob(
            job_id=job_id, req_id=req.req_id, kind=TransferKind.LOAD, gpu_block_ids=destination,
            chunk_slots=slots, chunk_indices=tuple(range(first_chunk, end_chunk)),
            skip_blocks=local_blocks % cfg.blocks_per_chunk))

    # ---- the plan of one step -------------------------------------------------------------

    def build_connector_meta(self, out: SchedulerOutput) -> StepPlan:
        allocated = self._allocated_this_step
        self._take_new_blocks(out, allocated)
        allocated.discard(NULL_BLOCK)

        flush = self._flush_next_plan
        for req_id in out.preempted_req_ids:  # their blocks are freed: every store must land first
            state = self._requests.get(req_id)
            if state is not None and state.stale_job_ids:
                state.crash_on_stale_jobs("build_connector_meta (preempted request)")
            flush.update(self.jobs.jobs_of(req_id))
        # The fence: a block handed out in this schedule may still be read by a pending store.
        flush.update(self.jobs.stores_reading(allocated))

        store_jobs = self._build_stores(out, allocated, flush)
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
        if len(self._cursor_moved) > MOVED_KEPT:  # nobody checks (invariants off): stay bounded
            self._cursor_moved.clear()
            self._check_every_cursor = True
        return plan

    def _take_new_blocks(self, out: SchedulerOutput, allocated: set[BlockId]) -> None:
        """The blocks this schedule appended join each request's table and the allocated set."""
        for req_id, new_blocks in out.new_block_ids.items():
            state = self._requests.get(req_id)
            if state is not None:
                state.block_ids.extend(new_blocks)
            allocated.update(new_blocks)

    def _build_stores(self, out: SchedulerOutput, allocated: set[BlockId], flush: set[JobId]) -> list[TransferJob]:
        return self._stores.build(self._requests, out, allocated, flush)

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
        if state.stale_job_ids:
            state.crash_on_stale_jobs("request_finished")
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
            self._release_if_done(state)

    def _has_jobs(self, state: RequestState) -> bool:
        return bool(state.stale_job_ids) or self.jobs.has_jobs(state.req.req_id)

    def _release_if_done(self, state: RequestState) -> None:
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
            state.move_cursor(0, self._tokens_per_chunk)
            if not self.fixes.reset_clears_request_jobs:
                state.stale_job_ids = state.stale_job_ids + jobs_by_request[req_id]
        self.manager.reset_cache()
        return True

    def has_pending_work(self) -> bool:
        # One tier and no background work in the manager: only jobs and flushes keep it busy.
        return bool(len(self.jobs) or self._flush_next_plan)

    # ---- introspection --------------------------------------------------------------------

    def tracked_request_ids(self) -> tuple[ReqId, ...]:
        return tuple(self._requests)

    def next_stored_chunk(self, req_id: ReqId) -> int:
        return self._requests[req_id].next_stored_chunk

    def check_invariants(self, full: bool = True) -> None:
        """Invariants I1-I4 (docs/design.md); without ``full`` the cheap part (counts, the jobs'
        requests, the store cursors: no set is built), with ``full`` every relation of the job
        indexes and the manager's O(capacity) checks."""
        self.jobs.check_invariants(full)
        self.manager.check_invariants(full)
        requests = self._requests
        if not self.jobs.request_keys() <= requests.keys():
            missing = next(req_id for req_id in self.jobs.request_keys() if req_id not in requests)
            raise AssertionError(f"I3: {missing!r} has jobs but no state")
        if self.fixes.storable_within_allocated:  # keys only grow: only a moved cursor can pass them
            every = full or self._check_every_cursor
            states = requests.values() if every else self._cursor_moved
            assert all([state.next_stored_chunk <= len(state.offload_keys) for state in states]), \
                "store cursor past the known keys"
        self._cursor_moved.clear()
        self._check_every_cursor = False
