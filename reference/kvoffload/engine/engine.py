"""The deterministic engine: replays requests through a connector in vLLM's step order.

One step (DESIGN.md, "One engine step"; notes B.1-B.4)::

    aborts, arrivals, reset_cache (scripted)
    1. schedule            running first (may preempt the newest), then waiting (GPU prefix hit,
                           connector lookup, allocate, update_state_after_alloc)
    2. build_connector_meta  before computed-token counters advance
    3. worker: handle_preemptions (submit deferred stores, fence), start_loads
    4. forward             writes the fingerprint of every scheduled position (drafts too)
       copies submitted and not waited on run now, after the forward: adversarial on purpose
    5. worker: get_finished  queues this plan's stores, reports completed copies
    6. update_from_output  spec rejection, append samples, stop -> request_finished -> free ->
                           update_connector_output
Async scheduling runs schedule(N+1) (and the forward N+1) before update_from_output(N).
"""

from __future__ import annotations

import gc
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np
import torch

from kvoffload.core.fixes import Fixes
from kvoffload.core.manager import LifecycleViolation
from kvoffload.core.scheduler import ReferenceConnectorScheduler
from kvoffload.core.types import (
    ConfigError,
    ConnectorCrash,
    RequestStatus,
    SchedulerOutput,
    StepPlan,
    TransferJob,
    TransferResult,
    cdiv,
)
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.cost import profile as hardware_profile
from kvoffload.engine.live import LiveRequest
from kvoffload.engine.oracle import extend_fingerprint, prefix_fingerprints, to_signed_int
from kvoffload.engine.record import Continuation, FenceViolation, PoisonedLoad, RunRecord
from kvoffload.engine.requests import RequestSpec
from kvoffload.worker.connector import WorkerConnector
from kvoffload.worker.kv import KVCache
from kvoffload.worker.stepped import SteppedTransferHandler

# Steps without any progress (nothing scheduled, nothing in flight, nothing to arrive) after
# which the run stops and reports the waiting requests as stuck.
STUCK_AFTER_STEPS = 200
# The O(capacity) invariant checks run this often (and at the end); the cheap ones every step.
FULL_CHECK_EVERY_STEPS = 256
# Steps writing at most this many positions per request compute slot indices in plain Python.
SMALL_WRITE = 16


class EngineInvariantError(AssertionError):
    """An invariant hook failed (raised only when the run asks for strict checking)."""


@dataclass(frozen=True)
class _Scheduled:
    """One request's share of a step, fixed at schedule time."""

    live: LiveRequest
    start: int  # first position written
    num_tokens: int  # positions written (1 + drafts while decoding)
    samples: bool  # the step ends with a sampled token for it
    accepted: int  # drafts that survive verification
    generation: int
    prefill: bool


class _OpenStore(NamedTuple):
    """A store job from its plan until its completion is processed."""

    job: TransferJob
    written_at: list[int]  # per chunk: the step its KV was fully written


class _LoadInFlight(NamedTuple):
    live: LiveRequest
    job: TransferJob


@dataclass(frozen=True)
class _StepOutput:
    step: int
    scheduled: tuple[_Scheduled, ...]
    results: tuple[TransferResult, ...]


class _RecordingHandler:
    """Passes every call through to the stepped handler, noting when each store was submitted."""

    def __init__(self, inner: SteppedTransferHandler, on_store_submitted: Callable[[TransferJob], None]):
        self._inner = inner
        self._on_store_submitted = on_store_submitted
        self.kv = inner.kv
        self.submitted_store_ids: set[int] = set()

    def submit_store(self, job: TransferJob) -> None:
        self._inner.submit_store(job)
        self.submitted_store_ids.add(job.job_id)
        self._on_store_submitted(job)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Engine:
    def __init__(self, requests: Sequence[RequestSpec], config: EngineConfig, fixes: Fixes | None = None, *,
                 reset_cache_at: Iterable[int] = (), check_invariants: bool = True,
                 strict: bool = False, trace: bool = False, max_steps: int | None = None,
                 on_step: Callable[[int, int], None] | None = None):
        self.config = config
        self.fixes = fixes if fixes is not None else Fixes()
        self.profile = hardware_profile(config.profile)
        self.check_invariants = check_invariants
        self.strict = strict
        self.trace = trace
        self.max_steps = max_steps
        self.on_step = on_step
        self.rng = random.Random(config.seed)
        bs = config.block_size
        try:
            self.kv = KVCache(config.gpu_blocks, bs, config.cpu_chunks, config.blocks_per_chunk, config.slot_bytes)
        except (RuntimeError, MemoryError) as error:  # torch's "can't allocate memory"
            gpu_bytes = config.gpu_blocks * bs * config.slot_bytes
            cpu_bytes = config.cpu_chunks * config.tokens_per_chunk * config.slot_bytes
            raise ConfigError(f"cannot allocate the KV tensors ({gpu_bytes:,} GPU-tier and {cpu_bytes:,} "
                              f"offload-tier bytes): lower gpu_blocks, cpu_chunks or slot_bytes") from error
        # int64 view of each slot's fingerprint, one row per slot: [gpu_blocks * block_size]
        self._slot_fp = self.kv.gpu.view(config.gpu_blocks * bs, config.slot_bytes).view(torch.int64)[:, 0]
        self.handler = SteppedTransferHandler(self.kv, config.store_completion_steps)
        self._handler_proxy = _RecordingHandler(self.handler, self._store_submitted)
        self.worker = WorkerConnector(self._handler_proxy, self.fixes)
        connector_config = config.connector_config()
        self.connector = ReferenceConnectorScheduler(connector_config, self.fixes)
        self.connector.manager.raise_on_violation = strict
        self.pool = BlockPool(config.gpu_blocks, bs)
        self.record = RunRecord()

        # Fingerprints of every request's scripted sequence, side by side (filled on arrival).
        self._fp_offsets: dict[str, int] = {}
        total = 0
        for spec in requests:
            self._fp_offsets[spec.req_id] = total
            total += spec.num_prompt_tokens + spec.max_tokens
        self._fp_arena = np.zeros(total, dtype=np.int64)
        self._specs = {spec.req_id: spec for spec in requests}
        if len(self._specs) != len(requests):
            raise ConfigError("request ids must be unique")
        for spec in requests:  # vLLM rejects what can never fit (max_model_len); so do we
            needed = cdiv(spec.num_prompt_tokens + spec.max_tokens + config.spec_tokens, bs)
            if needed > config.gpu_blocks - 1:
                raise ConfigError(f"request {spec.req_id} needs {needed} GPU blocks, but gpu_blocks="
                                  f"{config.gpu_blocks} leaves {config.gpu_blocks - 1}")
        self._children: dict[str, list[RequestSpec]] = {}
        self._arrivals: list[tuple[int, int, RequestSpec]] = []  # (step, order, spec)
        for order, spec in enumerate(requests):
            if spec.parent is None:
                self._arrivals.append((spec.arrival_step, order, spec))
            elif spec.parent not in self._specs:
                raise ConfigError(f"request {spec.req_id}: unknown parent {spec.parent!r}")
            else:
                self._children.setdefault(spec.parent, []).append(spec)
        self._arrivals.sort(key=lambda item: (item[0], item[1]))
        self._arrival_order = len(requests)
        self._reset_at = set(reset_cache_at)
        self._live: dict[str, LiveRequest] = {}
        self._finished: dict[str, LiveRequest] = {}
        self._waiting: deque[LiveRequest] = deque()
        self._running: list[LiveRequest] = []
        self._finished_since_schedule: list[str] = []
        self._loads_in_flight: dict[int, _LoadInFlight] = {}  # load job id ->
        self._aborts: dict[int, list[str]] = {}  # step -> requests to abort then
        self._open_stores: dict[int, _OpenStore] = {}  # store job id -> (built, completion unprocessed)
        self._chunk_written_at: dict[tuple[str, int], int] = {}
        self._pending_output: _StepOutput | None = None
        self._step = 0
        self._idle_steps = 0

    # ---- the run --------------------------------------------------------------------------

    def run(self) -> RunRecord:
        # As vLLM's engine does after startup: the workload and the engine's long-lived state
        # leave the collector's scans (15% of a replay's time otherwise). Undone on return.
        gc.collect()
        gc.freeze()
        started = time.perf_counter()
        try:
            while self._has_work():
                if self.max_steps is not None and self._step >= self.max_steps:
                    self.record.stuck_requests = tuple(self._live)
                    break
                if self._idle_steps >= STUCK_AFTER_STEPS:
                    self.record.stuck_requests = tuple(live.req_id for live in self._waiting)
                    break
                self._one_step()
                if self.on_step is not None:
                    self.on_step(self._step, len(self._finished))
            if self._pending_output is not None:
                self._update_from_output(self._pending_output)
                self._pending_output = None
        except (ConnectorCrash, LifecycleViolation, AssertionError, KeyError) as error:
            self.record.crash = f"{type(error).__name__}: {error}".replace("\n", " ")
            self.record.crash_step = self._step
        finally:
            self.worker.shutdown()
            gc.unfreeze()
        self._finish_record(time.perf_counter() - started)
        return self.record

    def _has_work(self) -> bool:
        return bool(self._arrivals or self._live or self._finished_since_schedule or self._pending_output
                    or self.connector.has_pending_work() or self.worker.has_unsubmitted_stores())

    def _one_step(self) -> None:
        step = self._step
        self._admit_arrivals(step)
        self._apply_aborts(step)
        if step in self._reset_at:
            self._timed(self.connector.reset_cache)
            self.pool.uncache_free_blocks()
        out, scheduled, preempted = self._schedule(step)
        plan = self._timed(self.connector.build_connector_meta, out)
        for item in scheduled:  # _update_after_schedule: counters advance after the build (O1)
            item.live.req.num_computed_tokens += item.num_tokens
            item.live.req.status = RequestStatus.RUNNING
            if item.samples and self.config.scheduling == "async":
                item.live.pending_outputs += 1
        self._note_store_jobs(plan, step)
        self._timed(self.worker.handle_preemptions, plan)
        self._timed(self.worker.start_loads, plan)
        self._forward(step, scheduled, plan)
        self.handler.run_submitted()  # copies not waited on read their source after the forward
        results = tuple(self._timed(self.worker.get_finished))
        self._model_time(scheduled, plan)
        output = _StepOutput(step, tuple(scheduled), results)
        if self.config.scheduling == "sync":
            self._update_from_output(output)
        else:
            if self._pending_output is not None:
                self._update_from_output(self._pending_output)
            self._pending_output = output if scheduled or results else None
        busy = scheduled or plan.load_jobs or plan.store_jobs or results or self._arrivals
        self._idle_steps = 0 if busy or not self._waiting else self._idle_steps + 1
        if self.check_invariants:
            self._check_invariants()
        self._step += 1
        self.record.steps = self._step

    def _timed(self, call, *args):
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.record.connector_seconds += time.perf_counter() - started

    # ---- arrivals and aborts --------------------------------------------------------------

    def _admit_arrivals(self, step: int) -> None:
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] <= step:
            _, _, spec = arrivals.pop(0)
            offset = self._fp_offsets[spec.req_id]
            live = LiveRequest.create(spec, self.config.block_size, step, offset)
            self._fp_arena[offset:offset + len(live.truth)] = prefix_fingerprints(
                np.asarray(live.truth, dtype=np.int64)).view(np.int64)
            self._live[spec.req_id] = live
            self._waiting.append(live)
            self.record.requests += 1
            self.record.prompt_tokens += spec.num_prompt_tokens
            if spec.abort_after_steps is not None:
                self._aborts.setdefault(step + spec.abort_after_steps, []).append(spec.req_id)
            self._timed(self.connector.on_new_request, live.req)

    def _schedule_children(self, parent: LiveRequest, step: int) -> None:
        for child in self._children.pop(parent.req_id, ()):
            arrival = step + 1 + child.think_steps
            self._arrival_order += 1
            index = len(self._arrivals)
            while index > 0 and self._arrivals[index - 1][0] > arrival:
                index -= 1
            self._arrivals.insert(index, (arrival, self._arrival_order, child))

    def _apply_aborts(self, step: int) -> None:
        """Scripted aborts (after arrivals, before the schedule: a client disconnect)."""
        for req_id in self._aborts.pop(step, ()):
            live = self._live.get(req_id)
            if live is None:
                continue  # finished before its abort
            live.abort_requested = True
            if live.load_job is not None:
                continue  # kept until its load lands (vLLM frees it then)
            self._finish(live, RequestStatus.FINISHED_ABORTED, step)

    # ---- schedule ---------------------------------------------------------------------------

    def _schedule(self, step: int) -> tuple[SchedulerOutput, list[_Scheduled], list[str]]:
        cfg = self.config
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        asynchronous = cfg.scheduling == "async"
        scheduled: list[_Scheduled] = []
        num_scheduled: dict[str, int] = {}
        new_blocks: dict[str, tuple[int, ...]] = {}
        preempted: list[str] = []

        index = 0
        while index < len(self._running) and budget > 0:
            live = self._running[index]
            req = live.req
            if asynchronous and live.scheduling_cap_reached():
                index += 1
                continue
            known = req.num_tokens + (live.pending_outputs if asynchronous else 0)
            remaining = known - req.num_computed_tokens
            drafts = cfg.spec_tokens if remaining == 1 and cfg.spec_tokens else 0
            count = min(remaining + drafts, budget)
            if count < remaining + drafts:
                drafts = 0
                count = min(remaining, budget)
            needed = cdiv(req.num_computed_tokens + count, bs) - len(live.blocks)
            while needed > self.pool.num_free:
                victim = self._running.pop()
                self._preempt(victim)
                preempted.append(victim.req_id)
                if victim is live:
                    break
            if live.status is RequestStatus.PREEMPTED:
                break
            if needed > 0:
                fresh = self.pool.allocate(needed)
                live.blocks.extend(fresh)
                new_blocks[live.req_id] = tuple(fresh)
            samples = req.num_computed_tokens + count >= known
            accepted = live.accepted_drafts(drafts, cfg.spec_acceptance, self.rng) if drafts else 0
            self._commit(live, count)
            scheduled.append(_Scheduled(live, req.num_computed_tokens, count, samples, accepted,
                                        live.generation, prefill=remaining > 1))
            num_scheduled[live.req_id] = count
            budget -= count
            index += 1

        skipped: list[LiveRequest] = []
        # Once a request could not get blocks, only requests whose load landed may still start:
        # they hold their blocks already, and running them is what frees blocks again.
        blocked = False
        while self._waiting and budget > 0 and len(self._running) < cfg.max_num_seqs and not preempted:
            live = self._waiting.popleft()
            req = live.req
            if live.load_job is not None or (blocked and not live.loaded):
                skipped.append(live)
                continue
            if live.loaded:  # the load landed: continue after the loaded tokens
                count = min(req.num_tokens - req.num_computed_tokens, budget)
                needed = cdiv(req.num_computed_tokens + count, bs) - len(live.blocks)
                if needed > self.pool.num_free:
                    skipped.append(live)
                    blocked = True
                    continue
                live.blocks.extend(self.pool.allocate(needed))
                live.loaded = False
            else:
                local_blocks = self.pool.cached_prefix(req.block_hashes, (req.num_tokens - 1) // bs)
                num_local = len(local_blocks) * bs
                hits, _ = self._timed(self.connector.get_num_new_matched_tokens, req, num_local)
                if hits is None:  # the connector asks to be asked again
                    skipped.append(live)
                    continue
                self.record.connector_lookups += 1
                self.record.connector_lookup_tokens += req.num_tokens - num_local
                count = 0 if hits else min(req.num_tokens - num_local, budget)
                # A load gets blocks for its whole prompt at once, so that once it lands it can
                # run without asking for more (a request holding blocks must be able to finish).
                needed = cdiv(req.num_tokens if hits else num_local + count, bs) - len(local_blocks)
                if needed > self.pool.num_free_after_taking(local_blocks):
                    skipped.append(live)
                    blocked = True
                    continue
                self._note_admission(live, num_local, hits)
                self.pool.take(local_blocks)
                live.blocks = local_blocks + self.pool.allocate(needed)
                live.num_committed_blocks = len(local_blocks)
                req.num_computed_tokens = num_local
                self._timed(self.connector.update_state_after_alloc, req, tuple(live.blocks), hits)
                if hits:
                    live.loaded_tokens = num_local + hits
                    live.load_job = -1  # its job id arrives with the plan
                    req.status = RequestStatus.WAITING_FOR_LOAD
                    skipped.append(live)
                    continue
            self._running.append(live)
            new_blocks[live.req_id] = tuple(live.blocks)
            known = req.num_tokens + (live.pending_outputs if asynchronous else 0)
            samples = req.num_computed_tokens + count >= known
            self._commit(live, count)
            scheduled.append(_Scheduled(live, req.num_computed_tokens, count, samples, 0, live.generation,
                                        prefill=True))
            num_scheduled[live.req_id] = count
            budget -= count
        for live in reversed(skipped):
            self._waiting.appendleft(live)

        finished = tuple(self._finished_since_schedule)
        self._finished_since_schedule = []
        out = SchedulerOutput(step=step, num_scheduled_tokens=num_scheduled, new_block_ids=new_blocks,
                              finished_req_ids=finished, preempted_req_ids=tuple(preempted))
        return out, scheduled, preempted

    def _commit(self, live: LiveRequest, num_new: int) -> None:
        """vLLM caches blocks when it allocates them, for the tokens known at that moment:
        min(computed + new, num_tokens). Drafts and async placeholders are not in num_tokens, so
        the block a request's final tokens fill is never committed (notes B.2 O4)."""
        req = live.req
        full_blocks = min(req.num_computed_tokens + num_new, req.num_tokens) // self.config.block_size
        if full_blocks > live.num_committed_blocks:
            self.pool.commit(live.blocks, req.block_hashes, live.num_committed_blocks, full_blocks)
            live.num_committed_blocks = full_blocks

    def _preempt(self, live: LiveRequest) -> None:
        """Recompute preemption: blocks back to the pool, progress forgotten, front of the queue."""
        self.pool.free(live.blocks)
        live.blocks = []
        live.num_committed_blocks = 0
        live.req.num_computed_tokens = 0
        live.req.status = RequestStatus.PREEMPTED
        live.generation += 1
        live.pending_outputs = 0
        self._waiting.appendleft(live)
        self.record.preemptions += 1

    def _note_admission(self, live: LiveRequest, num_local: int, hits: int) -> None:
        record = self.record
        record.admissions += 1
        record.admission_asked_tokens += live.req.num_tokens - num_local
        record.admission_hit_tokens += hits
        if live.admitted:
            return
        live.admitted = True
        record.gpu_hit_tokens += num_local
        record.admitted_prompt_tokens += live.req.num_tokens
        record.connector_hit_tokens_admitted += hits
        parent_id = live.spec.parent
        parent = self._finished.get(parent_id) if parent_id else None
        if parent is None:
            return
        tpc = self.config.tokens_per_chunk
        # Positions a forward pass wrote: all but the final sampled token's; an aborted request
        # only got as far as it was computed.
        written = parent.req.num_tokens - 1
        if parent.status is RequestStatus.FINISHED_ABORTED:
            written = min(written, parent.req.num_computed_tokens)
        last_chunk_end = (written // tpc) * tpc  # end of its last fully-written chunk
        prompt = live.spec.prompt_token_ids
        if last_chunk_end == 0 or parent.truth[:last_chunk_end] != prompt[:last_chunk_end]:
            return
        eligible = num_local < last_chunk_end
        record.continuations.append(Continuation(live.req_id, parent_id, eligible,
                                                 eligible and num_local + hits >= last_chunk_end))

    # ---- forward and copies -----------------------------------------------------------------

    def _forward(self, step: int, scheduled: Sequence[_Scheduled], plan: StepPlan) -> None:
        """Write each scheduled position's fingerprint into its slot (one tensor write per step)."""
        bs = self.config.block_size
        tpc = self.config.tokens_per_chunk
        small_slots: list[int] = []  # decode-sized writes, computed in Python
        small_sources: list[int] = []  # their arena indices
        big_slots: list[np.ndarray] = []
        big_sources: list[np.ndarray] = []
        draft_slots: list[int] = []
        draft_values: list[int] = []
        writes: dict[str, set[int]] = {}
        for item in scheduled:
            live = item.live
            blocks = live.blocks
            written_blocks = writes.setdefault(live.req_id, set())
            start, end = item.start, item.start + item.num_tokens
            if item.num_tokens > 1 and not item.prefill:  # 1 real token + drafts
                for position, value in self._draft_fingerprints(item):
                    block = blocks[position // bs]
                    written_blocks.add(block)
                    draft_slots.append(block * bs + position % bs)
                    draft_values.append(value)
            elif item.num_tokens <= SMALL_WRITE:
                for position in range(start, end):
                    block = blocks[position // bs]
                    written_blocks.add(block)
                    small_slots.append(block * bs + position % bs)
                    small_sources.append(live.fp_offset + position)
            else:
                first, last = start // bs, (end - 1) // bs
                table = np.asarray(blocks[first:last + 1], dtype=np.int64)
                positions = np.arange(start, end, dtype=np.int64)
                big_slots.append(table[positions // bs - first] * bs + positions % bs)
                big_sources.append(positions + live.fp_offset)
                written_blocks.update(blocks[first:last + 1])
            # Chunks whose last slot now holds valid KV (a rejected draft's KV does not count).
            valid_end = start + 1 + item.accepted if item.num_tokens > 1 and not item.prefill else end
            for chunk in range(cdiv(start + 1, tpc) - 1, valid_end // tpc):
                self._chunk_written_at[(live.req_id, chunk)] = step
        self._check_fence(step, plan, writes)
        if small_slots or big_slots or draft_slots:
            slots = np.concatenate([np.asarray(small_slots + draft_slots, dtype=np.int64), *big_slots])
            sources = np.concatenate([np.asarray(small_sources, dtype=np.int64), *big_sources])
            values = self._fp_arena[sources]
            if draft_slots:
                values = np.concatenate([values[:len(small_slots)], np.asarray(draft_values, dtype=np.int64),
                                         values[len(small_slots):]])
            self._slot_fp[torch.from_numpy(slots)] = torch.from_numpy(values)

    def _check_fence(self, step: int, plan: StepPlan, writes: dict[str, set[int]]) -> None:
        """No block a not-yet-copied store reads may be rewritten after its request let it go.

        Not yet copied at forward time: this plan's stores the worker has not submitted, and
        stores submitted but not waited on (they copy after this forward). The worker's queue
        for the next step is empty here: handle_preemptions drained it.
        """
        submitted = self._handler_proxy.submitted_store_ids
        not_copied = [job for job in plan.store_jobs if job.job_id not in submitted]
        in_handler = self.handler.pending_store_job_ids()
        if in_handler:
            not_copied += [self._open_stores[job_id].job for job_id in in_handler]
        if not not_copied:
            return
        readers: dict[int, set[str]] = {}
        for job in not_copied:
            owner = self._live.get(job.req_id)
            held = set(owner.blocks) if owner is not None else ()
            for block in job.gpu_block_ids:
                # A block its request still holds is shared at most through the prefix cache:
                # whoever writes it writes the same prefix. The hazard is a block handed on.
                if block not in held:
                    readers.setdefault(block, set()).add(job.req_id)
        load_writes = [(job.req_id, job.gpu_block_ids, "load") for job in plan.load_jobs]
        for writer, blocks, kind in [(r, b, "forward") for r, b in writes.items()] + load_writes:
            for block in blocks:
                if readers.get(block, {writer}) - {writer}:
                    self.record.fence_violations.append(FenceViolation(step, block, kind))

    def _draft_fingerprints(self, item: _Scheduled) -> list[tuple[int, int]]:
        """Decode step with drafts: position ``start`` is the real last token; draft j sits at
        ``start + 1 + j``. Accepted drafts carry the true prefix; from the first rejected one on,
        the slot holds KV of a prefix that never happened."""
        live = item.live
        arena, base, truth = self._fp_arena, live.fp_offset, live.truth
        previous = int(arena[base + item.start]) & ((1 << 64) - 1)
        written = [(item.start, to_signed_int(previous))]
        for j in range(item.num_tokens - 1):
            position = item.start + 1 + j
            if j < item.accepted and position < len(truth):
                previous = int(arena[base + position]) & ((1 << 64) - 1)
            else:
                wrong = truth[position] + 1 if position < len(truth) else 1
                previous = extend_fingerprint(previous, wrong)
            written.append((position, to_signed_int(previous)))
        return written

    def _note_store_jobs(self, plan: StepPlan, step: int) -> None:
        for job in plan.store_jobs:
            self._open_stores[job.job_id] = _OpenStore(job, [
                self._chunk_written_at.get((job.req_id, chunk), step) for chunk in job.chunk_indices])
        for job in plan.load_jobs:
            live = self._live[job.req_id]
            live.load_job = job.job_id
            self._loads_in_flight[job.job_id] = _LoadInFlight(live, job)
        if self.trace:
            for job in plan.load_jobs + plan.store_jobs:
                self.record.trace_events.append({"name": f"{job.kind.value} {job.job_id}", "ph": "i", "s": "t",
                                                 "ts": step, "pid": 0, "tid": job.req_id,
                                                 "args": {"chunks": list(job.chunk_indices),
                                                          "flushed": job.job_id in plan.jobs_to_flush}})

    def _store_submitted(self, job: TransferJob) -> None:
        self.record.store_submit_delays.extend(self._step - written
                                               for written in self._open_stores[job.job_id].written_at)

    def _model_time(self, scheduled: Sequence[_Scheduled], plan: StepPlan) -> None:
        prefill = sum(item.num_tokens for item in scheduled if item.prefill)
        decode = sum(1 for item in scheduled if not item.prefill)
        tpb = self.config.block_size
        loads = sum(len(job.gpu_block_ids) for job in plan.load_jobs) * tpb
        flushed = (self._open_stores.get(job_id) for job_id in plan.jobs_to_flush)  # this plan's and older
        flushes = sum(len(store.job.gpu_block_ids) for store in flushed if store is not None) * tpb
        self.record.scheduled_tokens += sum(item.num_tokens for item in scheduled)
        self.record.modeled_seconds += self.profile.step_seconds(prefill, decode, loads, flushes)

    # ---- update_from_output -----------------------------------------------------------------

    def _update_from_output(self, output: _StepOutput) -> None:
        step = output.step
        for item in output.scheduled:
            live = item.live
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
                self.record.output_tokens += len(tokens)
                rejected = item.num_tokens - 1 - item.accepted if not item.prefill else 0
                req.num_computed_tokens -= rejected
            if live.num_outputs >= live.spec.max_tokens:
                status = RequestStatus.FINISHED_STOPPED if live.spec.stop == "eos" else RequestStatus.FINISHED_LENGTH
                self._finish(live, status, step)
        # Completions are processed now (under async, one step after the step that produced them).
        self._deliver_results(output.results, self._step)

    def _finish(self, live: LiveRequest, status: RequestStatus, step: int) -> None:
        live.req.status = status
        if live in self._running:
            self._running.remove(live)
        if live in self._waiting:
            self._waiting.remove(live)
        self._timed(self.connector.request_finished, live.req, tuple(live.blocks))
        self.pool.free(live.blocks)
        live.blocks = []
        del self._live[live.req_id]
        self._finished[live.req_id] = live
        self._finished_since_schedule.append(live.req_id)
        self.record.finished_requests += 1
        self._schedule_children(live, step)

    def _deliver_results(self, results: Sequence[TransferResult], step: int) -> None:
        workers = self.config.workers
        acks = [result for result in results for _ in range(workers)]
        self._timed(self.connector.update_connector_output, acks)
        for result in results:
            store = self._open_stores.pop(result.job_id, None)
            if store is not None:
                self.record.store_visible_delays.extend(step - written for written in store.written_at)
                continue
            load = self._loads_in_flight.pop(result.job_id, None)
            if load is not None:
                self._load_landed(load.live, load.job, step)

    def _load_landed(self, live: LiveRequest, job: TransferJob, step: int) -> None:
        """finished_recving: check every loaded slot, then let the request run after its hit."""
        self._check_loaded_slots(live, job, step)
        live.load_job = None
        req = live.req
        if live.abort_requested:
            self._finish(live, RequestStatus.FINISHED_ABORTED, step)
            return
        # A full hit still recomputes the last token: something must produce the next sample.
        req.num_computed_tokens = min(live.loaded_tokens, req.num_tokens - 1)
        live.loaded = True
        req.status = RequestStatus.WAITING
        self._commit(live, 0)

    def _check_loaded_slots(self, live: LiveRequest, job: TransferJob, step: int) -> None:
        bs, tpc = self.config.block_size, self.config.tokens_per_chunk
        start = job.chunk_indices[0] * tpc + job.skip_blocks * bs
        end = (job.chunk_indices[-1] + 1) * tpc
        blocks = np.asarray(job.gpu_block_ids, dtype=np.int64)
        slots = (blocks[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        held = self._slot_fp[torch.from_numpy(slots)].numpy()
        expected = self._fp_arena[live.fp_offset + start:live.fp_offset + end]
        bad = held != expected
        if bad.any():
            positions = np.nonzero(bad)[0] + start
            for chunk in sorted(set((positions // tpc).tolist())):
                count = int(((positions // tpc) == chunk).sum())
                self.record.poisoned.append(PoisonedLoad(step, live.req_id, chunk, count))

    # ---- invariants and the end ---------------------------------------------------------------

    def _check_invariants(self, full: bool | None = None) -> None:
        if full is None:
            full = self._step % FULL_CHECK_EVERY_STEPS == 0
        try:
            self.connector.check_invariants(full)
            in_use = sum(len(live.blocks) for live in self._live.values())
            self.pool.check_invariants(in_use, full)
        except AssertionError as error:
            if self.strict:
                raise EngineInvariantError(str(error)) from error
            self.record.invariant_failures.append(f"step {self._step}: {error}")

    def _finish_record(self, wall: float) -> None:
        record = self.record
        if self.check_invariants and record.crash is None:
            self._check_invariants(full=True)
        record.wall_seconds = wall
        record.lifecycle_violations = len(self.connector.manager.violations)
        if record.crash is None and not record.stuck_requests:
            record.leaked_requests = self.connector.tracked_request_ids()
        stats = self.worker.stats()
        record.store_bytes, record.store_seconds = stats.stores.num_bytes, stats.stores.seconds
        record.load_bytes, record.load_seconds = stats.loads.num_bytes, stats.loads.seconds
        record.unknown_wait_ids = self.handler.stats().unknown_wait_ids
        record.connector_stats = dict(vars(self.connector.stats))
        if self.strict and record.fence_violations:
            raise EngineInvariantError(f"fence violated: {record.fence_violations[0]}")


def replay(requests: Sequence[RequestSpec], config: EngineConfig, fixes: Fixes | None = None, **kwargs) -> RunRecord:
    return Engine(requests, config, fixes, **kwargs).run()
