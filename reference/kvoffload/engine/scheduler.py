"""The engine's scheduler model: queues, admission, block allocation, preemption, commit.

It plays vLLM's ``Scheduler`` (``vllm/v1/core/sched/scheduler.py``) around the connector under
test: ``schedule()`` decides a step, ``update_from_output()`` applies its sampled tokens, and
:meth:`load_landed` lets a request whose load finished run again. Admission (the waiting side of
``schedule()``) lives in :mod:`.admission`. Every rule it follows is listed
with its vLLM version and function in docs/engine.md.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Callable

from kvoffload.core.types import RequestStatus, SchedulerOutput, StepPlan, cdiv
from kvoffload.engine import spec
from kvoffload.engine.admission import Admission
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.kv_groups import HybridKV
from kvoffload.engine.live import LiveRequest, Phase
from kvoffload.engine.observer import RunObserver
from kvoffload.engine.set_order import set_iteration_order
from kvoffload.engine.step import LoadInFlight, Scheduled, StepOutput  # noqa: F401 (the step's records, re-exported)


class SchedulerModel:
    def __init__(self, config: EngineConfig, pool: BlockPool, connector, observer: RunObserver,
                 on_finished: Callable[[LiveRequest, int], None]):
        self.config = config
        self.pool = pool
        self.connector = connector
        self.observer = observer
        self._timed = observer.timed
        self._on_finished = on_finished
        self.rng = random.Random(config.seed)
        self.live: dict[str, LiveRequest] = {}
        self.finished: dict[str, LiveRequest] = {}
        self.waiting: deque[LiveRequest] = deque()
        self.kv_holding: deque[LiveRequest] = deque()  # LOADING and LOADED requests, admitted first
        self.running: list[LiveRequest] = []
        self.finished_since_schedule: list[str] = []
        self.loads_in_flight: dict[int, LoadInFlight] = {}  # load job id ->
        # Admitted requests still short of blocks for their whole prompt (vLLM's
        # _inflight_prefills): an async load must leave room for them to finish.
        self.inflight_prefills: dict[str, LiveRequest] = {}
        # Deferred block frees (vLLM's defer_block_free, on with async scheduling and a
        # connector): a request's blocks go back only once the last step that scheduled it was
        # processed. Steps are counted when they schedule any token.
        self.scheduled_seq = 0  # non-empty steps scheduled
        self.processed_seq = 0  # non-empty steps whose output was processed
        self.deferred_frees: deque[tuple[int, list[int]]] = deque()  # (fence, blocks)
        self.blocks_awaiting_load: dict[str, list] = {}  # aborted while loading: freed when it lands
        # A hybrid model's groups (kv_groups.py); None for the dense model, whose one group the
        # code below handles inline.
        self.hybrid = None if config.kv_model.is_dense else HybridKV(config, pool)
        self.admission = Admission(self)
        self._held_sets: dict[str, list] = {}  # req_id -> [its block list, length seen, set of it]

    # ---- arrivals and aborts --------------------------------------------------------------

    def add(self, live: LiveRequest) -> None:
        self.live[live.req_id] = live
        if self.hybrid is not None:
            self.hybrid.clear(live)  # an empty table per group
        self.waiting.append(live)
        self._timed(self.connector.on_new_request, live.req)

    def abort(self, req_id: str, step: int) -> None:
        """A scripted abort (after arrivals, before the schedule: a client disconnect)."""
        live = self.live.get(req_id)
        if live is None:
            return  # finished before its abort
        # vLLM's finish_requests: a request whose KV is still loading finishes at once too, but
        # its blocks stay allocated until the load reports back (delay_free_blocks).
        self.finish(live, RequestStatus.FINISHED_ABORTED, step, load_in_flight=live.phase is Phase.LOADING)

    # ---- schedule ---------------------------------------------------------------------------

    def schedule(self, step: int) -> tuple[SchedulerOutput, list[Scheduled], list[str]]:
        scheduled: list[Scheduled] = []
        num_scheduled: dict[str, int] = {}
        new_blocks: dict[str, tuple[int, ...]] = {}
        preempted: list[str] = []
        mamba = self.hybrid is not None and self.hybrid.mamba
        if mamba:
            self.hybrid.new_step_starts()
        budget = self._schedule_running(scheduled, num_scheduled, new_blocks, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled, num_scheduled, new_blocks)
        if scheduled and any(item.num_tokens for item in scheduled):
            self.scheduled_seq += 1
        # vLLM keeps them in a set of str: the connector walks them in the set's order (set_order.py)
        finished = set_iteration_order(self.finished_since_schedule)
        self.finished_since_schedule = []
        out = SchedulerOutput(step=step, num_scheduled_tokens=num_scheduled, new_block_ids=new_blocks,
                              finished_req_ids=finished, preempted_req_ids=tuple(preempted),
                              boundary_states=self.hybrid.take_boundary_offers() if mamba else {})
        return out, scheduled, preempted

    def _schedule_running(self, scheduled, num_scheduled, new_blocks, preempted) -> int:
        """Running requests first, in order; one that cannot get blocks preempts the newest."""
        cfg = self.config
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        asynchronous = cfg.scheduling == "async"
        k = cfg.spec_tokens  # the spec.py calls only with drafts (the hot path stays short without)
        hybrid = self.hybrid
        index = 0
        while index < len(self.running) and budget > 0:
            live = self.running[index]
            req = live.req
            if asynchronous and live.scheduling_cap_reached():
                index += 1
                continue
            known = req.num_tokens + (live.placeholders if asynchronous else 0)
            remaining = known - req.num_computed_tokens
            count, drafts = spec.running_share(live, remaining, budget) if k else (min(remaining, budget), 0)
            if hybrid is not None and hybrid.mamba:  # before allocation; 0: skip it this step
                count = hybrid.split(live, req.num_computed_tokens, count)
                if not count:
                    index += 1
                    continue
            if hybrid is None:
                needed = cdiv(req.num_computed_tokens + count, bs) - len(live.blocks)
            else:  # allocate_slots: the window's skipped blocks go first
                hybrid.remove_skipped(live, req.num_computed_tokens - live.in_flight_tokens)
                needed = hybrid.blocks_for_running(live, req.num_computed_tokens + count)
            while needed > 0 and needed > self.pool.num_free:  # (never when no block is needed)
                victim = self.running[-1]
                if not self._can_free(victim):  # a deferred free would not help now
                    break
                self.running.pop()
                self._preempt(victim)
                preempted.append(victim.req_id)
                if victim is live:
                    break
            # preempted itself, or stuck
            if live.phase is Phase.WAITING or (needed > 0 and needed > self.pool.num_free):
                break
            if needed > 0:
                if hybrid is None:
                    fresh = self.pool.allocate(needed)
                    live.blocks.extend(fresh)
                    new_blocks[live.req_id] = tuple(fresh)
                else:
                    new_blocks[live.req_id] = hybrid.allocate(live, req.num_computed_tokens + count)
            samples = req.num_computed_tokens + count >= known
            accepted = live.accepted_drafts(drafts, cfg.spec_acceptance, self.rng) if drafts else 0
            if hybrid is not None:
                hybrid.cache(live, min(req.num_computed_tokens + count, req.num_tokens))
            elif min(req.num_computed_tokens + count, req.num_tokens) // bs > live.num_committed_blocks:
                self.commit(live, count)  # (its test inlined: most steps fill no block)
            start = spec.scheduled(live, drafts, accepted) if k else req.num_computed_tokens
            scheduled.append(Scheduled(live, start, count, samples, accepted, live.generation,
                                       prefill=remaining > 1, drafts=drafts))
            num_scheduled[live.req_id] = count
            budget -= count
            index += 1
        return budget

    def _schedule_waiting(self, budget, scheduled, num_scheduled, new_blocks) -> None:
        """Admission (``admission.py``) walks the queues; a request it admits to run joins the step here."""
        asynchronous = self.config.scheduling == "async"

        def join_step(live: LiveRequest, count: int) -> None:
            req = live.req
            live.phase = Phase.RUNNING
            self.running.append(live)
            new_blocks[live.req_id] = tuple(live.blocks) if self.hybrid is None else self.hybrid.block_ids(live)
            known = req.num_tokens + (live.placeholders if asynchronous else 0)
            samples = req.num_computed_tokens + count >= known
            if req.num_computed_tokens + count < req.num_tokens:  # a chunked prefill: its rest is reserved
                self.inflight_prefills[live.req_id] = live
            self.commit(live, count)
            drafts = max(0, req.num_computed_tokens + count - req.num_tokens)  # padding (spec.DecodePadding)
            scheduled.append(Scheduled(live, spec.scheduled(live, drafts, 0), count, samples, 0, live.generation,
                                       prefill=not drafts, drafts=drafts))
            num_scheduled[live.req_id] = count

        self.admission.padding = spec.DecodePadding(self.config, scheduled)
        self.admission.admit(budget, join_step)

    def commit_computed(self, live: LiveRequest, num_tokens: int) -> None:
        """Cache the request's full blocks below ``num_tokens`` (``KVCacheManager.cache_blocks``)."""
        req = live.req
        if self.hybrid is not None:
            self.hybrid.cache(live, min(num_tokens, req.num_tokens, len(live.blocks) * self.hybrid.sizes[0]))
            return
        full_blocks = min(num_tokens, req.num_tokens, len(live.blocks) * self.config.block_size) \
            // self.config.block_size
        if full_blocks > live.num_committed_blocks:
            self.pool.commit(live.blocks, req.block_hashes, live.num_committed_blocks, full_blocks)
            live.num_committed_blocks = full_blocks

    def _can_free(self, live: LiveRequest) -> bool:
        """vLLM's ``_request_blocks_can_be_freed``: no unprocessed step still writes its blocks."""
        return live.last_scheduled_seq <= self.processed_seq

    def _free_blocks(self, live: LiveRequest) -> None:
        if self.hybrid is not None:
            self.hybrid.release(live, self.deferred_frees if not self._can_free(live) else None, self.scheduled_seq)
            return
        if live.blocks:
            if self._can_free(live):
                self.pool.free(live.blocks)
            else:
                self.deferred_frees.append((self.scheduled_seq, live.blocks))
        live.blocks = []

    def _drain_deferred_frees(self) -> None:
        while self.deferred_frees and self.deferred_frees[0][0] <= self.processed_seq:
            self.pool.free(self.deferred_frees.popleft()[1])

    def commit(self, live: LiveRequest, num_new: int) -> None:
        """vLLM caches blocks when it allocates them, for the tokens known at that moment:
        min(computed + new, num_tokens). Drafts and async placeholders are not in num_tokens."""
        req = live.req
        if self.hybrid is not None:
            self.hybrid.cache(live, min(req.num_computed_tokens + num_new, req.num_tokens))
            return
        full_blocks = min(req.num_computed_tokens + num_new, req.num_tokens) // self.config.block_size
        if full_blocks > live.num_committed_blocks:
            self.pool.commit(live.blocks, req.block_hashes, live.num_committed_blocks, full_blocks)
            live.num_committed_blocks = full_blocks

    def _preempt(self, live: LiveRequest) -> None:
        """Recompute preemption: blocks back to the pool, progress forgotten, front of the queue."""
        self._free_blocks(live)
        self.inflight_prefills.pop(live.req_id, None)
        live.num_committed_blocks = 0
        live.req.num_computed_tokens = 0
        live.req.status = RequestStatus.PREEMPTED
        live.phase = Phase.WAITING
        live.generation += 1
        live.pending_outputs = 0
        spec.forget(live)
        self.waiting.appendleft(live)
        self.observer.preempted(live)

    def after_schedule(self, scheduled: list[Scheduled]) -> None:
        """vLLM's ``_update_after_schedule``: counters advance after the connector's build."""
        asynchronous, k = self.config.scheduling == "async", self.config.spec_tokens
        running, seq, inflight = RequestStatus.RUNNING, self.scheduled_seq, self.inflight_prefills
        hybrid = self.hybrid is not None
        for item in scheduled:
            live = item.live
            req = live.req
            req.num_computed_tokens += item.num_tokens
            if hybrid:
                live.in_flight_tokens += item.num_tokens
            req.status = running
            live.last_scheduled_seq = seq
            if item.samples and asynchronous:
                live.pending_outputs += 1
                if k:
                    spec.after_schedule(live, item.drafts, k)
                else:
                    live.placeholders += 1
            if inflight and req.num_computed_tokens >= req.num_tokens:  # no longer a prefill chunk
                inflight.pop(live.req_id, None)

    def plan_built(self, plan: StepPlan) -> None:
        for job in plan.load_jobs:
            self.loads_in_flight[job.job_id] = LoadInFlight(self.live[job.req_id], job)

    # ---- update_from_output -----------------------------------------------------------------

    def update_from_output(self, output: StepOutput) -> None:
        """Append each scheduled request's samples (drafts verified) and finish what stopped."""
        step = output.step
        asynchronous, k = self.config.scheduling == "async", self.config.spec_tokens
        bs = self.config.block_size
        if any(item.num_tokens for item in output.scheduled):
            self.processed_seq += 1
            self._drain_deferred_frees()
        hybrid = self.hybrid is not None
        for item in output.scheduled:
            live = item.live
            if hybrid:
                live.in_flight_tokens -= item.num_tokens
            if item.samples and live.pending_outputs and item.generation == live.generation:
                live.pending_outputs -= 1
            if live.status.is_finished or item.generation != live.generation:
                continue  # output of a finished (async extra step) or preempted request: dropped
            req = live.req
            if item.samples:
                count = item.accepted + 1
                tokens = live.truth[req.num_tokens:req.num_tokens + count]
                req.append_tokens(tokens)
                live.num_outputs += len(tokens)
                self.observer.sampled(len(tokens))
                if k:
                    spec.verified(live, item.drafts, item.accepted, len(tokens), asynchronous, k)
                elif asynchronous:
                    live.placeholders -= len(tokens)
                # AsyncScheduler._update_request_with_output -> cache_blocks (only when a block filled)
                if asynchronous and (req.num_computed_tokens - live.placeholders) // bs > live.num_committed_blocks:
                    self.commit_computed(live, req.num_computed_tokens - live.placeholders)
            if live.num_outputs >= live.spec.max_tokens:
                status = RequestStatus.FINISHED_STOPPED if live.spec.stop == "eos" else RequestStatus.FINISHED_LENGTH
                self.finish(live, status, step)

    def load_landed(self, live: LiveRequest, step: int) -> None:
        """finished_recving: the request may run after its hit; if it was aborted meanwhile, its
        blocks are freed now (vLLM's ``_update_from_kv_xfer_finished`` -> ``_free_blocks``)."""
        if live.phase is Phase.FINISHED:
            held = self.blocks_awaiting_load.pop(live.req_id)
            self.pool.free(held) if self.hybrid is None else self.hybrid.free_tables(held)
            return
        req = live.req
        # A full hit still recomputes the last token: something must produce the next sample.
        req.num_computed_tokens = min(live.loaded_tokens, req.num_tokens - 1)
        live.phase = Phase.LOADED
        req.status = RequestStatus.WAITING

    def finish(self, live: LiveRequest, status: RequestStatus, step: int, load_in_flight: bool = False) -> None:
        live.req.status = status
        live.phase = Phase.FINISHED
        if live in self.running:
            self.running.remove(live)
        if live in self.waiting:
            self.waiting.remove(live)
        if live in self.kv_holding:
            self.kv_holding.remove(live)
        self.inflight_prefills.pop(live.req_id, None)
        self.pool.forget_prefix(live.req_id)
        self._held_sets.pop(live.req_id, None)
        self._timed(self.connector.request_finished, live.req,
                    tuple(live.blocks) if self.hybrid is None else self.hybrid.finishing(live))
        if load_in_flight:  # the load still writes them
            self.blocks_awaiting_load[live.req_id] = live.blocks if self.hybrid is None else live.tables
            live.blocks = []
            if self.hybrid is not None:
                self.hybrid.clear(live)
        else:
            self._free_blocks(live)
        del self.live[live.req_id]
        self.finished[live.req_id] = live
        self.finished_since_schedule.append(live.req_id)
        self.observer.finished(live)
        self._on_finished(live, step)

    # ---- reset ----------------------------------------------------------------------------------

    def reset_prefix_cache(self) -> bool:
        """vLLM 0.32 ``Scheduler.reset_prefix_cache(reset_running_requests=False,
        reset_connector=True)`` (docs/engine.md, "Resetting the caches"): nothing is preempted; the
        GPU prefix cache is reset only while no block is in use (``BlockPool.reset_prefix_cache``),
        the connector's cache whatever the GPU answered (``reset_connector_cache() and ...`` calls
        it first). True only when both were reset."""
        gpu_reset = self.pool.reset_prefix_cache()
        connector_reset = self._timed(self.connector.reset_cache) is not False
        return connector_reset and gpu_reset

    # ---- state for the engine -----------------------------------------------------------------

    def blocks_in_use(self) -> int:
        """Block-table entries of live requests plus blocks whose free is deferred or that an
        aborted request's load still writes. Only running and KV-holding requests hold blocks (a
        waiting one holds none: preemption frees them, admission allocates as it leaves the
        queue), so the sum runs over those: O(running), not O(waiting), every step. A waiting
        request that kept blocks would show as blocks referenced by no request."""
        if self.hybrid is not None:
            in_use = self.hybrid.blocks_in_use(self.running, self.kv_holding, self.blocks_awaiting_load.values())
        else:
            in_use = sum([len(live.blocks) for live in self.running]) + sum([len(live.blocks) for live in self.kv_holding])
            if self.blocks_awaiting_load:
                in_use += sum(len(blocks) for blocks in self.blocks_awaiting_load.values())
        if self.deferred_frees:
            in_use += sum(len(blocks) for _, blocks in self.deferred_frees)
        return in_use

    def blocks_held_by(self, req_id: str) -> set[int] | tuple:
        """The blocks a live request holds (the fence check asks for each store not yet copied).
        Block tables only grow while they are the same list (``extend``; a free or an admission
        puts a new list in place), so the set is kept and grown, not rebuilt each step."""
        owner = self.live.get(req_id)
        if owner is None:
            self._held_sets.pop(req_id, None)
            return ()
        if owner.tables is not None:  # a hybrid model: every group's blocks
            return {block for table in owner.tables for block in table if block}
        blocks = owner.blocks
        kept = self._held_sets.get(req_id)
        if kept is None or kept[0] is not blocks:
            kept = self._held_sets[req_id] = [blocks, len(blocks), set(blocks)]
        elif kept[1] != len(blocks):
            kept[2].update(blocks[kept[1]:])
            kept[1] = len(blocks)
        return kept[2]
