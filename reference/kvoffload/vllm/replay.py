"""The ``vllm-scheduler`` engine: a workload replayed through vLLM's own scheduler.

vLLM 0.32's ``Scheduler`` (sync) or ``AsyncScheduler`` (async) decides everything a scheduler
decides: admission, GPU prefix-cache hits, block allocation, preemption, when requests finish.
The connector under test runs both roles as vLLM builds them; its worker side copies between
vLLM's paged KV tensors and its host tier. Only the model is fake (``model.py``): it writes the
oracle's fingerprints and samples the workload's scripted tokens.

Step order, as ``EngineCore.step`` (sync) and ``step_with_batch_queue`` (async) run it::

    arrivals (add_request), scripted aborts (finish_requests), scripted resets, schedule()
    execute: worker connector calls around the fingerprint writes (model.py)
    sync:  update_from_output(this step), then the drafts of the next step
    async: update_from_output(the previous step)

Arrivals, follow-ups and aborts follow the simulator's rules (``kvoffload.engine``): a follow-up
arrives ``think_steps`` steps after the step that finished its parent.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import tempfile
import time
from collections import defaultdict

from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import Request, RequestStatus

from kvoffload.core.types import ConfigError
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S, ConnectorTimeout, StepBound, bound_methods, deadline
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.crashes import record_crash
from kvoffload.engine.engine import STUCK_AFTER_STEPS  # one definition of "stuck" for both engines
from kvoffload.engine.record import RunRecord
from kvoffload.engine.watchdog import ProgressWatchdog
from kvoffload.vllm.build import (
    ConnectorLoad,
    build_kv_cache_config,
    build_scheduler,
    build_vllm_config,
    build_worker_side,
    release_worker_side,
)
from kvoffload.vllm.connector_parts import (block_copy_backend, tracked_requests, transfer_handler,
                                            wait_for_unreported_copies)
from kvoffload.vllm.fake_worker import FakeWorker
from kvoffload.vllm.foreign import check_runs_here
from kvoffload.vllm.group_blocks import scheduler_block_sizes
from kvoffload.vllm.model import BlockTables, DrafterCells, FingerprintCells, ScriptedSequence, StateCells
from kvoffload.vllm.observe import AdmissionLedger, StoreSubmitDelays, timed_methods
from kvoffload.workloads.tokens import EOS_ID

EOS_SLACK = 8  # an EOS answer may run this much longer: the scheduler must not know its length
FILLER_TOKEN = 17  # sampled past the script (async: the step scheduled after an EOS)
SCHEDULER_CALLS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc",
                   "build_connector_meta", "update_connector_output", "request_finished", "has_pending_push_work",
                   "take_events", "get_kv_connector_stats")
WORKER_CALLS = ("handle_preemptions", "bind_connector_metadata", "start_load_kv", "wait_for_save", "get_finished",
                "build_connector_worker_meta", "clear_connector_metadata")
# What this engine cannot see from outside the connector (absent from its metrics, not zero).
# The stuck_requests watchdog is this engine's own (no progress for STUCK_AFTER_STEPS steps);
# the simulator's cycle detector (livelock) and invariant checks run inside its engine only, and
# so does last_chunk_offloaded_rate (it reads the simulator's offload tier, engine/final_chunks.py).
# Store submission delays are measured at the project's transfer handler, which both built-in
# connectors copy through (StoreSubmitDelays); a foreign connector's own worker hides them.
STORE_SUBMIT_DELAYS = ("store_submit_delay_steps_p50", "store_submit_delay_steps_p99")
UNMEASURED = ("fence_violations", *STORE_SUBMIT_DELAYS,
              "store_visible_delay_steps_p50", "store_visible_delay_steps_p99", "tokens_per_s_modeled",
              "invariant_violations", "last_chunk_offloaded_rate")


class VllmSchedulerReplay(FakeWorker):
    def __init__(self, requests, engine: EngineConfig, load: ConnectorLoad, *, transfer: str = "stepped",
                 on_step=None, max_steps: int | None = None, reset_cache_at=(),
                 step_bound_s: float | None = DEFAULT_STEP_BOUND_S):
        check_runs_here(load.source)  # a GPU-only connector: one "could not start" line
        self.bound = StepBound(step_bound_s)  # a connector call that never returns stops the run, named
        self.engine = engine
        self._reset_at = frozenset(reset_cache_at)  # a workload's [resets], as the simulator's
        self.on_step = on_step
        self.max_steps = max_steps
        self._storage = None  # a disk connector's folder when the caller gave none (gone at close)
        if load.needs_storage and load.storage_dir is None:
            self._storage = tempfile.TemporaryDirectory(prefix="kvoffload-kv-store-")
            load = dataclasses.replace(load, storage_dir=self._storage.name)
        self.load = load
        self.specs = {spec.req_id: spec for spec in requests}
        if len(self.specs) != len(requests):
            raise ConfigError("request ids must be unique")
        longest = max(spec.num_prompt_tokens + spec.max_tokens + EOS_SLACK for spec in requests)
        self.config = build_vllm_config(engine, load.transfer_config(engine, transfer),
                                        longest + engine.spec_tokens + engine.block_size, load)
        kv_cache_config = build_kv_cache_config(self.config, engine)
        self.bound.calls.stack.append(("the connector's construction and register_kv_caches", None))
        with self.bound.start():
            self.scheduler = build_scheduler(self.config, kv_cache_config)
            try:
                self.kv_caches, self.worker = build_worker_side(self.config, kv_cache_config, load.standins,
                                                                engine.store_completion_steps)
            except BaseException:
                self.scheduler.shutdown()
                raise
        self.bound.calls.stack.clear()
        # Fingerprint cells per KV cache group, each written with its salt (engine/oracle.py).
        # A Mamba group's cells hold one state per block (model.py, StateCells).
        self.group_cells = [(StateCells if type(group.kv_cache_spec).__name__ == "MambaSpec" else DrafterCells
                             if getattr(group, "is_eagle_group", False) else FingerprintCells)(
                                {name: self.kv_caches[name] for name in group.layer_names})
                            for group in kv_cache_config.kv_cache_groups]
        self.cells = self.group_cells[0]
        self.tables = BlockTables(len(self.group_cells))
        self.record = RunRecord()
        self.rng = random.Random(engine.seed)
        self.ledger = AdmissionLedger(engine.block_size, engine.blocks_per_chunk, self.record, self.specs)
        self._timings = defaultdict(float)
        connector = self.scheduler.connector
        timed_methods(connector, SCHEDULER_CALLS, self._timings)
        timed_methods(self.worker, WORKER_CALLS, self._timings)
        # outside the timing: its own cost is not the connector's
        self.ledger.attach(connector, self.scheduler.kv_cache_manager)
        bound_methods(connector, SCHEDULER_CALLS, self.bound.calls)  # which call a hang is in
        bound_methods(self.worker, WORKER_CALLS, self.bound.calls)
        self.store_delays = StoreSubmitDelays(engine.block_size, self.record)
        handler, backend = transfer_handler(self.worker), block_copy_backend(self.worker)
        if handler is not None:
            self.store_delays.attach(handler)
        elif backend is not None:
            self.store_delays.attach_block_copies(backend)
        init_none_hash(sha256)
        # Requests hashed at the groups' gcd where they have block sizes of their own (EngineCore).
        self._hasher = get_request_block_hasher(scheduler_block_sizes(self.config, kv_cache_config).get(
            "hash_block_size", engine.block_size), sha256)
        # Each group's block size (its grid; the page is the largest's, vllm/group_blocks.py).
        self.group_sizes = [group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups]
        self._arrivals: list[tuple[int, int, str]] = sorted(
            (spec.arrival_step, order, spec.req_id) for order, spec in enumerate(requests) if spec.parent is None)
        self._children = defaultdict(list)
        for spec in requests:
            if spec.parent is not None:
                if spec.parent not in self.specs:
                    raise ConfigError(f"request {spec.req_id}: unknown parent {spec.parent!r}")
                self._children[spec.parent].append(spec.req_id)
        self._order = len(requests)
        self._aborts: dict[int, list[str]] = defaultdict(list)
        self._sequences: dict[str, ScriptedSequence] = {}
        self._requests: dict[str, Request] = {}
        self._finished: set[str] = set()
        self._alive: set[str] = set()  # admitted, not finished: what the watchdog reports stuck
        # A release's scheduler can go round in circles (docs/fidelity.md, "A connector that asks
        # for KV delivery"): the simulator's watchdog bounds the replay the same way.
        self.watchdog = ProgressWatchdog(engine.store_completion_steps)
        self._written_ends: list[tuple[str, int]] = []  # this step's passes: request, written up to
        self._spec_steps: dict[str, int] = defaultdict(int)
        self._pending = None  # async: what _update needs of the previous step
        self._step = 0
        self.checked_load_tokens = 0  # positions the oracle checked after their load landed

    # ---- the run ----------------------------------------------------------------------------

    def run(self) -> RunRecord:
        gc.collect()
        gc.freeze()
        started = time.perf_counter()
        try:
            with self.bound.watching():
                self._loop()
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever a connector raises is its crash (engine/crashes.py)
            record_crash(self.record, error, self._step)
        finally:
            gc.unfreeze()
        self._finish_record(time.perf_counter() - started)
        return self.record

    def _loop(self) -> None:
        idle = 0
        while (self._arrivals or self.scheduler.has_requests() or self._pending is not None
               or wait_for_unreported_copies(self.worker)):
            if (self.max_steps is not None and self._step >= self.max_steps) or idle >= STUCK_AFTER_STEPS:
                self.record.stuck_requests = tuple(r for r in self._requests if r not in self._finished)
                break
            if self.record.livelock is not None:
                break
            self.bound.at(self._step)
            progressed = self._one_step() or wait_for_unreported_copies(self.worker)
            idle = 0 if progressed or self._arrivals else idle + 1
            if self.on_step is not None:
                self.on_step(self._step, len(self._finished))

    def _one_step(self) -> bool:
        step = self._step
        self._admit(step)
        for req_id in self._aborts.pop(step, ()):
            if req_id not in self._finished:
                loading = (self._requests[req_id].status == RequestStatus.WAITING_FOR_REMOTE_KVS
                           and req_id not in self.scheduler.finished_recving_kv_req_ids)  # not seen landing
                self.scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)
                self._on_finished(req_id, step, loading)
        if step in self._reset_at:  # vLLM's API call between two steps, after the simulator's aborts
            self.record.resets.append((step, self.scheduler.reset_prefix_cache(reset_connector=True)))
        scheduler_output = self.scheduler.schedule()
        self.record.preemptions += len(scheduler_output.preempted_req_ids or ())
        for req_id in scheduler_output.preempted_req_ids or ():
            self.watchdog.preempted(req_id)
        executed = self._execute(step, scheduler_output)
        kv_out = executed[2].kv_connector_output
        busy = bool(scheduler_output.num_scheduled_tokens or kv_out.finished_recving
                    or kv_out.kv_connector_worker_meta is not None)
        if self.config.scheduler_config.async_scheduling:
            if self._pending is not None:
                self._update(*self._pending)
            self._pending = executed if busy else None
        else:
            self._update(*executed)
        verdict = self.watchdog.observe_ends(step, self._written_ends, self.record.finished_requests, self._alive)
        if verdict is not None:
            self.record.livelock = verdict.as_dict()
            self.record.livelock_message = verdict.describe()
            self.record.stuck_requests = verdict.alive
        self._step += 1
        self.record.steps = self._step
        return busy

    def _admit(self, step: int) -> None:
        while self._arrivals and self._arrivals[0][0] <= step:
            _, _, req_id = self._arrivals.pop(0)
            spec = self.specs[req_id]
            eos = spec.stop == "eos"
            params = SamplingParams(max_tokens=spec.max_tokens + (EOS_SLACK if eos else 0), ignore_eos=not eos)
            params.update_from_generation_config({}, EOS_ID)
            request = Request(request_id=req_id, prompt_token_ids=list(spec.prompt_token_ids),
                              sampling_params=params, pooling_params=None, block_hasher=self._hasher)
            self._requests[req_id] = request
            self._alive.add(req_id)
            self._sequences[req_id] = ScriptedSequence(spec.prompt_token_ids + spec.output_token_ids)
            self.record.requests += 1
            self.record.prompt_tokens += spec.num_prompt_tokens
            if spec.abort_after_steps is not None:
                self._aborts[step + spec.abort_after_steps].append(req_id)
            self.scheduler.add_request(request)

    def _on_finished(self, req_id: str, step: int, loading: bool = False) -> None:
        self._finished.add(req_id)
        self._alive.discard(req_id)
        request = self._requests[req_id]
        self.record.finished_requests += 1
        self.record.output_tokens += request.num_output_tokens
        self.ledger.parent_finished(req_id, self._sequences[req_id].truth, request, loading)
        for child in self._children.pop(req_id, ()):
            arrival = step + 1 + self.specs[child].think_steps
            self._order += 1
            index = len(self._arrivals)
            while index > 0 and self._arrivals[index - 1][0] > arrival:
                index -= 1
            self._arrivals.insert(index, (arrival, self._order, child))

    # ---- update_from_output -------------------------------------------------------------------

    def _update(self, step: int, scheduler_output, output, samples, accepted) -> None:
        sampled = []
        for req_id in output.req_ids:
            if req_id not in samples:
                sampled.append([])
                continue
            request, truth = self._requests[req_id], self._sequences[req_id].truth
            first = request.num_tokens
            count = accepted.get(req_id, 0) + 1
            sampled.append([truth[i] if i < len(truth) else FILLER_TOKEN for i in range(first, first + count)])
        output.sampled_token_ids = sampled
        self.scheduler.update_from_output(scheduler_output, output)
        drafts = []
        for req_id in output.req_ids:
            request = self._requests[req_id]
            if req_id not in self._finished and request.is_finished():
                self._on_finished(req_id, step)
            elif self.engine.spec_tokens and req_id in samples and not self.config.scheduler_config.async_scheduling:
                drafts.append(req_id)  # async: the scheduler keeps placeholder drafts itself
        if output.kv_connector_output.invalid_block_ids:
            # A failed load fails its request under vLLM's default kv_load_failure_policy, also one
            # still waiting for the load and so in no pass (scheduler.py, _handle_invalid_blocks):
            # it has finished too, and its follow-ups arrive.
            for req_id in sorted(self._alive):
                if self._requests[req_id].is_finished():
                    self._on_finished(req_id, step)
        if drafts:
            proposal = [[FILLER_TOKEN] * self.engine.spec_tokens for _ in drafts]
            self.scheduler.update_draft_token_ids(DraftTokenIds(drafts, proposal))

    def _finish_record(self, wall: float) -> None:
        record = self.record
        record.wall_seconds = wall
        record.connector_seconds = sum(self._timings.values())
        connector = self.scheduler.connector
        core = getattr(connector, "core", None)
        if core is not None:
            record.lifecycle_violations = len(core.manager.violations)
            record.connector_stats = dict(vars(core.stats))
        if record.crash is None and not record.stuck_requests:
            record.leaked_requests = tracked_requests(connector) or ()
        handler = transfer_handler(self.worker)
        if handler is not None:  # both built-in workers copy through a FanOutHandler
            (record.store_bytes, record.store_seconds), (record.load_bytes, record.load_seconds) = (
                handler.totals[True], handler.totals[False])
        self.close()

    def close(self) -> None:
        """Stop both sides of the connector (the worker's copy threads and buffers): after a run,
        or instead of one (a gate story skipped once the replay is built). A connector that fails
        to stop, or never stops, must not hide the run's result."""
        try:
            with deadline(self.bound.seconds, lambda: "the connector's shutdown did not return"):
                self.scheduler.shutdown()
        except Exception:  # noqa: BLE001
            pass
        try:
            with deadline(self.bound.seconds, lambda: "the connector's worker shutdown did not return"):
                release_worker_side(self.worker)
        except ConnectorTimeout:
            pass
        if self._storage is not None:
            self._storage.cleanup()

    def unmeasured(self) -> tuple[str, ...]:
        """UNMEASURED, plus what this connector does not expose: lifecycle violations are the
        reference manager's strict mode; leaks need the connector's request table."""
        connector = self.scheduler.connector
        extra = () if getattr(connector, "core", None) is not None else ("lifecycle_violations",)
        if tracked_requests(connector) is None:
            extra += ("leaked_requests",)
        copies = transfer_handler(self.worker) or block_copy_backend(self.worker)
        measured = () if copies is None else STORE_SUBMIT_DELAYS  # observe.py
        return tuple(name for name in UNMEASURED if name not in measured) + extra

    @property
    def timings(self) -> dict[str, float]:
        return dict(self._timings)

