"""The deterministic engine: replays requests through a connector in vLLM's step order.

One step (docs/engine.md, "One engine step")::

    arrivals, scripted aborts, scripted reset_cache
    1. schedule              running first (may preempt the newest), then waiting (GPU prefix
                             hit, connector lookup, allocate, update_state_after_alloc)
    2. build_connector_meta  before computed-token counters advance
    3. worker                handle_preemptions (submit deferred stores, fence), start_loads
    4. forward               the oracle writes every scheduled position's fingerprint (drafts
                             too); copies submitted and not waited on run after it, on purpose
    5. worker                get_finished: queue this plan's stores, report completed copies
    6. update_from_output    samples, stops -> request_finished -> free; then the completions
                             (update_connector_output, loaded-slot check)
Async scheduling runs schedule(N+1) (and the forward N+1) before update_from_output(N).

Owners: :mod:`.scheduler` (queues, admission, allocation, preemption, commit), :mod:`.oracle`
(fingerprints, loaded-slot and fence checks), :mod:`.observer` (everything recorded),
:mod:`.feed` (arrivals and scripted aborts). This module is the loop that ties them together.
"""

from __future__ import annotations

import gc
import time
from typing import Callable, Iterable, Sequence

from kvoffload.core.fixes import Fixes
from kvoffload.core.hybrid import connector_scheduler
from kvoffload.core.keys import hash_tokens
from kvoffload.core.model import GroupKind
from kvoffload.core.types import BlockId, ConfigError, TransferResult, cdiv
from kvoffload.engine.block_grids import BlockGrids
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S, StepBound
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.crashes import record_crash
from kvoffload.engine.drafter_kv import drafter_slot_groups
from kvoffload.engine.cost import profile as hardware_profile
from kvoffload.engine.feed import ArrivalFeed
from kvoffload.engine.final_chunks import FinalChunkWatch
from kvoffload.engine.live import LiveRequest, Phase
from kvoffload.engine.observer import RunObserver
from kvoffload.engine.oracle import KVOracle
from kvoffload.engine.record import RunRecord
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.scheduler import SchedulerModel, StepOutput
from kvoffload.engine.spec import padding_never_fits
from kvoffload.engine.watchdog import ProgressWatchdog
from kvoffload.worker.connector import WorkerConnector
from kvoffload.worker.kv import KVCache
from kvoffload.worker.stepped import SteppedTransferHandler

# Steps without any progress (nothing scheduled, nothing in flight, nothing to arrive) after
# which the run stops and reports the waiting requests as stuck.
STUCK_AFTER_STEPS = 200
# The O(capacity) invariant checks run this often (and at the end); the cheap ones every step.
FULL_CHECK_EVERY_STEPS = 256


class EngineInvariantError(AssertionError):
    """An invariant hook failed (raised only when the run asks for strict checking)."""


class Engine:
    def __init__(self, requests: Sequence[RequestSpec], config: EngineConfig, fixes: Fixes | None = None, *,
                 reset_cache_at: Iterable[int] = (), check_invariants: bool = True,
                 strict: bool = False, trace: bool = False, max_steps: int | None = None,
                 on_step: Callable[[int, int], None] | None = None, skip_idle: bool = True,
                 step_bound_s: float | None = DEFAULT_STEP_BOUND_S):
        self.config = config
        self._bound = StepBound(step_bound_s)  # a step running longer is the connector's hang
        self.fixes = fixes if fixes is not None else Fixes()
        self.check_invariants = check_invariants
        self.strict = strict
        self.max_steps = max_steps
        self.on_step = on_step
        # Idle gaps are jumped (on_step then hears once, with the step after the gap); False walks
        # them step by step: for hooks that must see every step, and the jump-equals-walk tests.
        self.skip_idle = skip_idle
        bs = config.block_size
        unsupported = config.kv_model.unsupported()
        if unsupported is not None:
            raise ConfigError(f"model {config.model!r}: {unsupported}")
        if config.kv_model.has_own_block_sizes and config.blocks_per_chunk != 1:
            # vLLM's stock connector chunks such groups one block each (vllm/group_blocks.py).
            raise ConfigError(f"model {config.model!r} has groups of their own block sizes: a chunk is one block "
                              f"of each, blocks_per_chunk must be 1, got {config.blocks_per_chunk}")
        # Request hashes are at the groups' gcd (core/keys.py): the block size, unless groups have their own.
        self._hash_block = hash_tokens(config.kv_model.groups, bs)
        # Groups of their own block sizes share padded pages (engine/block_grids.py): a GPU block
        # and a tier chunk hold the largest group's block; the oracle indexes each group's grid.
        grids = BlockGrids(config.kv_model.groups, bs)
        self._sizes = grids.sizes
        page, own_sizes = grids.page, () if grids.uniform else grids.sizes
        # A hybrid model's groups other than group 0 get the forward's writes too (oracle.py).
        self._other_groups = [(g, group.kind is GroupKind.MAMBA) for g, group in enumerate(config.kv_model.groups)][1:]
        try:
            self.kv = KVCache(config.gpu_blocks, page, config.cpu_chunks, config.blocks_per_chunk, config.slot_bytes)
        except (RuntimeError, MemoryError) as error:  # torch's "can't allocate memory"
            gpu_bytes = config.gpu_blocks * page * config.slot_bytes
            cpu_bytes = config.cpu_chunks * config.blocks_per_chunk * page * config.slot_bytes
            raise ConfigError(f"cannot allocate the KV tensors ({gpu_bytes:,} GPU-tier and {cpu_bytes:,} "
                              f"offload-tier bytes): lower gpu_blocks, cpu_chunks or slot_bytes") from error
        self.oracle = KVOracle(self.kv, requests, page, config.tokens_per_chunk,
                               state_groups=[group for group, state in self._other_groups if state],
                               group_sizes=own_sizes, drafter_groups=drafter_slot_groups(config.kv_model.groups))
        self.feed = ArrivalFeed(requests, check=self._check_fits)
        self.observer = RunObserver(hardware_profile(config.profile), bs, config.tokens_per_chunk, trace)
        self.record = self.observer.record
        self.handler = SteppedTransferHandler(self.kv, config.store_completion_steps)
        self.worker = WorkerConnector(self.handler, self.fixes, on_store_submitted=self.observer.store_submitted)
        self.connector = connector_scheduler(config.connector_config(), self.fixes)
        self.connector.manager.raise_on_violation = strict
        self.pool = BlockPool(config.gpu_blocks, bs)
        self.scheduler = SchedulerModel(config, self.pool, self.connector, self.observer,
                                        on_finished=self._finished)
        self.watchdog = ProgressWatchdog(config.store_completion_steps)
        self.observer.watchdog = self.watchdog
        self.observer.final_chunks = FinalChunkWatch(self.oracle, self._sizes[0] * config.blocks_per_chunk,
                                                     config.offload_prompt_only)
        self._reset_at = set(reset_cache_at)
        self._pending_output: StepOutput | None = None  # async: the step whose output is unprocessed
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
            with self._bound.watching():
                self._loop()
            if self._pending_output is not None:
                self._update_from_output(self._pending_output)
                self._pending_output = None
        except ConfigError:
            raise  # bad input found on the way (a streamed request that can never fit)
        except Exception as error:  # noqa: BLE001 - any exception the connector raises is its crash
            record_crash(self.record, error, self._step)
        finally:
            self.worker.shutdown()
            gc.unfreeze()
        self._finish_record(time.perf_counter() - started)
        return self.record

    def _loop(self) -> None:
        while self._has_work():
            if self.max_steps is not None and self._step >= self.max_steps:
                self.record.stuck_requests = tuple(self.scheduler.live)
                self.record.max_steps_reached = True
                break
            if self._idle_steps >= STUCK_AFTER_STEPS:
                self.record.stuck_requests = tuple(live.req_id for live in (*self.scheduler.kv_holding,
                                                                            *self.scheduler.waiting))
                self.record.stuck_message = self._why_stuck()
                break
            if self.skip_idle and self._skip_idle_gap():
                continue
            self._bound.at(self._step)
            self._one_step()
            if self.record.livelock is not None:
                break
            if self.on_step is not None:
                self.on_step(self._step, self.record.finished_requests)

    def _has_work(self) -> bool:
        return bool(self.feed.has_pending() or self.scheduler.live or self.scheduler.finished_since_schedule
                    or self._pending_output or self.connector.has_pending_work()
                    or self.worker.has_unsubmitted_stores())

    def _skip_idle_gap(self) -> bool:
        """Jump over steps where nothing can happen: nothing live, in flight or unreported, and
        the next arrival (or scripted cache reset, or max_steps) still ahead. Such a step only
        costs the modelled step overhead, which the observer charges for the whole gap."""
        next_arrival = self.feed.next_arrival_step()
        if (next_arrival is None or next_arrival <= self._step + 1 or self.scheduler.live
                or self.scheduler.finished_since_schedule or self.scheduler.deferred_frees
                or self._pending_output is not None
                or self.connector.has_pending_work() or self.worker.has_unsubmitted_stores()):
            return False
        target = min([next_arrival] + [step for step in self._reset_at if step > self._step]
                     + ([self.max_steps] if self.max_steps is not None else []))
        if target <= self._step:
            return False
        self.observer.idle_steps(target - self._step)
        self.watchdog.observe(target - 1, (), self.record.finished_requests, ())  # as the walk's last idle step
        self._step = self.record.steps = target
        if self.on_step is not None:
            self.on_step(self._step, self.record.finished_requests)
        return True

    def _one_step(self) -> None:
        step = self._step
        timed, observer, scheduler, worker = self.observer.timed, self.observer, self.scheduler, self.worker
        observer.step = step
        self._arrive(step)
        for req_id in self.feed.aborts(step):
            scheduler.abort(req_id, step)
        if step in self._reset_at:  # an API call between two steps; vLLM hands the answer back
            self.record.resets.append((step, scheduler.reset_prefix_cache()))
        # 1-2. schedule, then the connector's plan, then the counters advance (vLLM's order)
        out, scheduled, _ = scheduler.schedule(step)
        plan = timed(self.connector.build_connector_meta, out)
        scheduler.after_schedule(scheduled)
        observer.plan_built(plan, step)
        scheduler.plan_built(plan)
        # 3. the worker before the forward: deferred stores, the flush fence, the loads
        timed(worker.handle_preemptions, plan)
        timed(worker.start_loads, plan)
        # 4. the forward; the oracle checks the fence before the writes land
        observer.forward_written(step, scheduled)
        writes = self.oracle.forward(scheduled)
        for group, state in self._other_groups:
            self.oracle.forward_group(scheduled, group, state)
        not_copied = observer.unsubmitted(plan.store_jobs) + [
            observer.open_stores[job_id].job for job_id in self.handler.pending_store_job_ids()]
        self.record.fence_violations += self.oracle.check_fence(step, plan, writes, not_copied,
                                                                scheduler.blocks_held_by)
        self.handler.run_submitted()  # copies not waited on read their source after the forward
        # 5. the worker after the forward
        results = tuple(timed(worker.get_finished))
        observer.model_step(scheduled, plan)
        # 6. update_from_output: now (sync) or after the next step's schedule (async)
        output = StepOutput(step, tuple(scheduled), results, frozenset(worker.take_block_ids_with_load_errors()))
        if self.config.scheduling == "sync":
            self._update_from_output(output)
        else:
            if self._pending_output is not None:
                self._update_from_output(self._pending_output)
            self._pending_output = output if scheduled or results else None
        busy = scheduled or plan.load_jobs or plan.store_jobs or results or self.feed.has_pending()
        self._idle_steps = 0 if busy or not (scheduler.waiting or scheduler.kv_holding) else self._idle_steps + 1
        verdict = self.watchdog.observe(step, scheduled, self.record.finished_requests, scheduler.live)
        if verdict is not None:
            self.record.livelock = verdict.as_dict()
            self.record.livelock_message = verdict.describe()
            self.record.stuck_requests = verdict.alive
        if self.check_invariants:
            self._check_invariants()
        self._step += 1
        self.record.steps = self._step

    def _why_stuck(self) -> str:
        stuck = self.record.stuck_requests
        named = ", ".join(stuck[:3]) + (", ..." if len(stuck) > 3 else "")
        message = (f"{len(stuck)} request{'s' * (len(stuck) > 1)} stuck ({named}): nothing was scheduled for "
                   f"{STUCK_AFTER_STEPS} steps while they waited")
        config, head = self.config, (self.scheduler.kv_holding or self.scheduler.waiting)[0]
        if padding_never_fits(config) and head.req.num_computed_tokens == head.req.num_tokens - 1 > 0:
            # vLLM 0.32 accepts the setting and hangs the same way (docs/engine.md, "Speculative decoding").
            message += (f"; {head.req_id} has one token left to compute, admission pads it to a decode "
                        f"step of 1 + spec_tokens = {1 + config.spec_tokens} tokens, over "
                        f"max_num_batched_tokens={config.max_num_batched_tokens}, and schedules nothing instead")
        return message

    def _check_fits(self, spec: RequestSpec) -> None:
        """vLLM rejects what can never fit (max_model_len); so do we (a streamed request at arrival)."""
        config = self.config
        needed = cdiv(spec.num_prompt_tokens + spec.max_tokens + config.spec_tokens, config.block_size)
        if needed > config.gpu_blocks - 1:
            raise ConfigError(f"request {spec.req_id} needs {needed} GPU blocks, but gpu_blocks="
                              f"{config.gpu_blocks} leaves {config.gpu_blocks - 1}")

    def _arrive(self, step: int) -> None:
        for spec in self.feed.arrivals(step):
            live = LiveRequest.create(spec, self._hash_block, step)
            self.oracle.register(live)
            self.observer.arrived(live)
            self.scheduler.add(live)

    def _finished(self, live: LiveRequest, step: int) -> None:
        """Memory follows what is live: a finished request's fingerprints go, and so does the
        request itself unless follow-ups will read it as their parent (continuation metrics)."""
        self.oracle.release(live)
        if not self.feed.has_follow_ups(live.req_id):
            self.scheduler.finished.pop(live.req_id, None)
        self.feed.parent_finished(live.req_id, step)

    def _update_from_output(self, output: StepOutput) -> None:
        self.scheduler.update_from_output(output)
        # Completions are processed now (under async, one step after the step that produced them).
        self._process_completions(output.results, output.load_error_blocks, self._step)

    def _process_completions(self, results: Sequence[TransferResult], invalid: frozenset[BlockId], step: int) -> None:
        workers = self.config.workers
        acks = [result for result in results for _ in range(workers)]
        self.observer.timed(self.connector.update_connector_output, acks)
        # A failed load's blocks hold garbage: keep the prefix before the first of them and
        # recompute the rest (vLLM Scheduler._handle_invalid_blocks, recompute policy). The
        # worker reports them, not the connector's scheduler side: a reset_cache there makes
        # the load's completion stale, and the blocks were still not written (docs/engine.md).
        for result in results:
            if self.observer.store_completed(result, step):
                continue
            load = self.scheduler.loads_in_flight.pop(result.job_id, None)
            if load is not None:
                if load.live.phase is Phase.FINISHED:  # aborted while loading: nobody reads these slots
                    self.scheduler.load_landed(load.live, step)
                    continue
                failed = sorted(i * size for table, size in zip(load.live.tables or (load.live.blocks,), self._sizes)
                                for i, block in enumerate(table) if block in invalid) if invalid else ()  # every group's
                if failed:
                    load.live.loaded_tokens = failed[0]
                else:
                    self.record.poisoned += self.oracle.check_loaded_slots(load.live, load.job, step)
                self.scheduler.load_landed(load.live, step)

    # ---- invariants and the end ---------------------------------------------------------------

    def _check_invariants(self, full: bool | None = None) -> None:
        if full is None:
            full = self._step % FULL_CHECK_EVERY_STEPS == 0
        for rule in ("connector", "block-pool"):  # rule ids: docs/engine.md, "Invariants"
            try:
                if rule == "connector":
                    self.connector.check_invariants(full)
                else:
                    self.pool.check_invariants(self.scheduler.blocks_in_use(), full)
            except AssertionError as error:
                if self.strict:
                    raise EngineInvariantError(f"{rule}: {error}") from error
                self.observer.invariant_failed(self._step, rule, error)

    def _finish_record(self, wall: float) -> None:
        record = self.record
        if self.check_invariants and record.crash is None:
            self._check_invariants(full=True)
        record.wall_seconds = wall
        record.final_chunks = self.observer.final_chunks.counted
        record.final_chunks_offloaded = self.observer.final_chunks.offloaded
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
