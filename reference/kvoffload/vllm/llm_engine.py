"""The ``vllm`` engine: a workload through vLLM's real engine and a real model, measured.

vLLM 0.32's offline V1 engine (``LLMEngine``, the engine core in this process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) runs the model, by default the tiny Llama shape shipped in
``tiny_llama/`` with seeded random weights (:mod:`kvoffload.vllm.weights`, written as a
checkpoint to a temporary folder for the engine's lifetime), or any local model
directory (``--model``). The connector is loaded as the ``vllm-scheduler`` engine loads it
(``build.ConnectorLoad``), with real copies (``transfer = "auto"``: threads on the CPU, the
CUDA handler on CUDA); ``off`` runs no connector and no prefix caching (the oracle's second run).

Arrivals map to engine iterations, not to wall time: a request arriving at workload step ``s``
is added just before the engine's ``s``-th ``step()``, a follow-up ``think_steps`` iterations
after the one that finished its parent (the simulator's rule). On a shared 2-core machine the
wall time of an iteration varies several-fold with the load; step-mapped arrivals give every
connector, and the oracle's offload-off run, the same request order and the same overlap, so
hit rates and outputs can be compared across runs and only the measured times vary.

Each request keeps the workload's prompt and output lengths (``ignore_eos``, ``max_tokens`` =
the scripted output's length, EOS included), greedy sampling with the sampled token's
log-probability. A follow-up's prompt is its parent's prompt plus the tokens the model produced
plus the follow-up's own new turn.
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from vllm import SamplingParams  # without the vllm extra: engines.py says what is missing
from vllm.distributed.kv_transfer import get_kv_transfer_group
from vllm.inputs import TokensPrompt

from kvoffload.core.types import ConfigError
from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S, StepBound, bound_methods
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.crashes import record_crash
from kvoffload.engine.engine import STUCK_AFTER_STEPS  # one definition of "stuck" for every engine
from kvoffload.engine.record import RunRecord
from kvoffload.engine.set_order import HASH_SEED, process_hash_seed_is
from kvoffload.vllm.build import ConnectorLoad
from kvoffload.vllm.foreign import check_runs_here
from kvoffload.vllm.geometry import ModelChoice, engine_geometry
from kvoffload.vllm.llm_start import OFF, shut_down, start_engine, transfer_config
from kvoffload.vllm.observe import AdmissionLedger, StoreSubmitDelays, timed_methods
from kvoffload.vllm.outputs import RequestOutcome, compare_outputs
from kvoffload.vllm.pinned import call_pinned
from kvoffload.vllm.connector_parts import tracked_requests, transfer_handler, wait_for_unreported_copies
from kvoffload.vllm.replay import SCHEDULER_CALLS, STORE_SUBMIT_DELAYS, WORKER_CALLS
from kvoffload.vllm.scheduled_writes import ScheduledWrites

# Glossary metrics this engine cannot observe (absent, not zero): the fingerprint oracle, fences
# and store visibility live in the simulated KV cache and engine; the cost model is the
# simulator's. Store submission delays are measured where the connector copies through the
# project's transfer handler under sync scheduling (scheduled_writes.py).
UNMEASURED = ("poisoned_loads", "fence_violations", *STORE_SUBMIT_DELAYS,
              "store_visible_delay_steps_p50", "store_visible_delay_steps_p99", "tokens_per_s_modeled",
              "livelock", "invariant_violations", "sim_requests_per_s", "last_chunk_offloaded_rate")


@dataclass
class ModelRun:
    """A finished real-model replay: the record the metrics read, and every request's outcome."""

    record: RunRecord
    outcomes: dict[str, RequestOutcome]
    engine: EngineConfig  # the geometry the engine ran (block size mapped for the attention backend)
    start_seconds: float
    unmeasured: tuple[str, ...]


def run_on_model(requests, workload_engine: EngineConfig, source: str, model: ModelChoice, *, preset=None,
                 disabled=(), on_step=None, max_steps: int | None = None,
                 step_bound_s: float | None = DEFAULT_STEP_BOUND_S, storage_dir: str | None = None) -> ModelRun:
    engine = engine_geometry(workload_engine)
    longest = max(spec.num_prompt_tokens + spec.max_tokens for spec in requests)
    slack = engine.spec_tokens + engine.block_size  # follow-ups of aborted parents run shorter, never longer
    with tempfile.TemporaryDirectory(prefix="kvoffload-model-") as weights_dir:
        bound = StepBound(step_bound_s)
        bound.calls.stack.append(("vLLM's engine start (the connector's construction and register_kv_caches)", None))
        try:
            load = ConnectorLoad(source) if source != OFF else None
            if load is not None:
                check_runs_here(source)  # a GPU-only connector: one "could not start" line
            if load is not None and load.needs_storage and storage_dir is None:
                storage_dir = str(Path(weights_dir) / "kv-store")  # gone with the run's temporary folder
            with bound.start():
                llm, start_seconds = start_engine(engine, model, transfer_config(source, engine, model, preset,
                                                                                 disabled, storage_dir),
                                                  min(longest + slack, model.max_model_len), Path(weights_dir),
                                                  load.standins if load is not None else None)
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - the connector could not be built or registered
            shut_down(None)
            record = RunRecord(model_run=True, engine_settings={"model": model.label})
            record_crash(record, error, None, starting=True)
            return ModelRun(record, {}, engine, 0.0, UNMEASURED)
        try:
            bound.calls.stack.clear()
            replay = _Replay(llm, requests, engine, on_step, max_steps, bound)
            record = replay.run()
            unmeasured = replay.unmeasured()
        finally:
            shut_down(llm)
    record.engine_settings["model"] = model.label  # not the temporary folder of the seeded weights
    return ModelRun(record, replay.outcomes, engine, start_seconds, unmeasured)


class _Replay:
    def __init__(self, llm, requests, engine: EngineConfig, on_step, max_steps, bound: StepBound):
        self.llm, self.engine, self.on_step, self.max_steps = llm, engine, on_step, max_steps
        self.bound = bound
        self.specs = {spec.req_id: spec for spec in requests}
        self.actual: dict = {}  # req_id -> the spec with its actual prompt (the ledger reads them)
        self.outcomes: dict[str, RequestOutcome] = {}
        self.record = RunRecord()
        self._arrivals = sorted((spec.arrival_step, order, spec.req_id)
                                for order, spec in enumerate(requests) if spec.parent is None)
        self._children = defaultdict(list)
        for spec in requests:
            if spec.parent is not None:
                self._children[spec.parent].append(spec.req_id)
        self._order = len(requests)
        self._aborts: dict[int, list[str]] = defaultdict(list)
        self._finished: set[str] = set()
        self._step = 0
        self._quiet_steps = 0  # consecutive steps with unfinished requests and no output
        self.ledger = None
        self.scheduler = llm.engine_core.engine_core.scheduler
        self.connector = self.scheduler.connector
        self.worker = None
        self._timings: dict[str, float] = defaultdict(float)
        if self.connector is not None:
            self.worker = get_kv_transfer_group()  # the worker role: this process runs the model too
            timed_methods(self.connector, SCHEDULER_CALLS, self._timings)
            timed_methods(self.worker, WORKER_CALLS, self._timings)
            self.ledger = AdmissionLedger(engine.block_size, engine.blocks_per_chunk, self.record, self.actual)
            self.ledger.attach(self.connector)  # outside the timing: its own cost is not the connector's
            bound_methods(self.connector, SCHEDULER_CALLS, bound.calls)  # which call a hang is in
            bound_methods(self.worker, WORKER_CALLS, bound.calls)
        self.store_delays = None
        handler = transfer_handler(self.worker)
        if handler is not None and not llm.vllm_config.scheduler_config.async_scheduling:
            self.store_delays = StoreSubmitDelays(engine.block_size, self.record)
            self.store_delays.attach(handler)
            ScheduledWrites(self.scheduler, self.store_delays)

    def run(self) -> RunRecord:
        started = time.perf_counter()
        try:
            with self.bound.watching():
                while self._arrivals or self.llm.has_unfinished_requests():
                    if self.max_steps is not None and self._step >= self.max_steps:
                        self.record.max_steps_reached = True
                        break
                    if self._quiet_steps >= STUCK_AFTER_STEPS:
                        break
                    self.bound.at(self._step)
                    self._one_step()
                self.record.wall_seconds = time.perf_counter() - started
                self._drain()
        except Exception as error:  # noqa: BLE001 - whatever a connector raises is its crash (engine/crashes.py)
            record_crash(self.record, error, self._step)
            self.record.wall_seconds = time.perf_counter() - started
        if self.record.crash is None:
            self.record.stuck_requests = tuple(r for r in self.outcomes if r not in self._finished)
        self._finish_record()
        return self.record

    def _drain(self) -> None:
        """The connector's deferred work (the last finished request's state, stores in flight)
        ends within a few scheduler steps; vLLM keeps stepping while it has any. Each step first
        waits for the copies in flight, so it reports them: the run ends, and says what is still
        tracked, by the steps the connector took, not by how fast a copy thread ran."""
        for index in range(STUCK_AFTER_STEPS):
            if not self.scheduler.has_requests():
                break
            wait_for_unreported_copies(self.worker)
            self.bound.at(self._step + index)
            self._engine_step(self._step + index)

    def _engine_step(self, step: int):
        if self.store_delays is not None:
            self.store_delays.step = step
        return self.llm.step()

    def _one_step(self) -> None:
        step = self._step
        self._admit(step)
        for req_id in self._aborts.pop(step, ()):
            if req_id not in self._finished:
                self.llm.abort_request([req_id])
                self._done(req_id, step, aborted=True)
        outputs = self._engine_step(step)
        now = time.perf_counter()
        # A step with nothing to show while copies are in flight (a request waiting for its load)
        # waits for them instead of counting as quiet: STUCK_AFTER_STEPS empty steps pass in
        # milliseconds, a copy may take longer (the vllm-scheduler replay's rule, replay.py).
        busy = self.llm.has_unfinished_requests()
        quiet = busy and not outputs and not wait_for_unreported_copies(self.worker)
        self._quiet_steps = self._quiet_steps + 1 if quiet else 0
        for output in outputs:
            self._observe(output, now, step)
        if self.ledger is not None:
            for req_id, claim in self.ledger.pending_loads.items():
                self.outcomes[req_id].loaded.append(claim)
            self.ledger.pending_loads.clear()
        self._step += 1
        self.record.steps = self._step
        if self.on_step is not None:
            self.on_step(self._step, len(self._finished))

    def _prompt(self, spec) -> tuple[int, ...]:
        """A follow-up's prompt: its parent's actual prompt and output, then its own new turn."""
        if spec.parent is None:
            return tuple(spec.prompt_token_ids)
        parent_spec, parent = self.specs[spec.parent], self.outcomes[spec.parent]
        scripted = tuple(parent_spec.prompt_token_ids) + tuple(parent_spec.output_token_ids)
        prompt = tuple(spec.prompt_token_ids)
        if prompt[:len(scripted)] != scripted:
            return prompt  # not a continuation of its parent's sequence: sent as written
        return parent.prompt + tuple(parent.tokens) + prompt[len(scripted):]

    def _admit(self, step: int) -> None:
        while self._arrivals and self._arrivals[0][0] <= step:
            _, _, req_id = self._arrivals.pop(0)
            spec = self.specs[req_id]
            prompt = self._prompt(spec)
            self.actual[req_id] = replace(spec, prompt_token_ids=prompt)
            params = SamplingParams(max_tokens=len(spec.output_token_ids), ignore_eos=True, temperature=0.0,
                                  logprobs=0, detokenize=False)
            self.outcomes[req_id] = RequestOutcome(req_id, prompt, added_at=time.perf_counter())
            self.record.requests += 1
            self.record.prompt_tokens += len(prompt)
            if spec.abort_after_steps is not None:
                self._aborts[step + spec.abort_after_steps].append(req_id)
            self.llm.add_request(req_id, TokensPrompt(prompt_token_ids=list(prompt)), params)

    def _observe(self, output, now: float, step: int) -> None:
        req_id = output.request_id
        outcome = self.outcomes.get(req_id)
        if outcome is None or req_id in self._finished:
            return
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        if len(tokens) > len(outcome.tokens):
            if outcome.first_token_at is None:
                outcome.first_token_at = now
                self.record.prefill_tokens_computed += len(outcome.prompt) - (output.num_cached_tokens or 0)
            outcome.last_token_at = now
            logprobs = completion.logprobs or ()
            outcome.logprobs = [entry[token].logprob for token, entry in zip(tokens, logprobs)]
            outcome.tokens = tokens
        if output.finished:
            self._done(req_id, step, aborted=False)

    def _done(self, req_id: str, step: int, aborted: bool) -> None:
        self._finished.add(req_id)
        outcome = self.outcomes[req_id]
        outcome.aborted = aborted
        self.record.finished_requests += 1
        self.record.output_tokens += len(outcome.tokens)
        if outcome.first_token_at is not None:
            self.record.ttft_seconds.append(outcome.first_token_at - outcome.added_at)
            if len(outcome.tokens) > 1 and not aborted:
                self.record.tpot_seconds.append((outcome.last_token_at - outcome.first_token_at)
                                                / (len(outcome.tokens) - 1))
        if self.ledger is not None:
            self.ledger.parent_finished(req_id, outcome.prompt + tuple(outcome.tokens), _Finished(
                len(outcome.prompt) + len(outcome.tokens), aborted))
        for child in self._children.pop(req_id, ()):
            arrival = step + 1 + self.specs[child].think_steps
            self._order += 1
            index = len(self._arrivals)
            while index > 0 and self._arrivals[index - 1][0] > arrival:
                index -= 1
            self._arrivals.insert(index, (arrival, self._order, child))

    def _finish_record(self) -> None:
        record = self.record
        record.model_run = True
        config = self.llm.vllm_config
        spec = config.speculative_config
        record.engine_settings = {
            "model": str(config.model_config.model), "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "block_size": self.engine.block_size, "blocks_per_chunk": self.engine.blocks_per_chunk,
            "gpu_blocks": self.engine.gpu_blocks, "prefix_caching": bool(config.cache_config.enable_prefix_caching),
            # vLLM's CPU platform turns async scheduling off (vllm/platforms/cpu.py)
            "async_scheduling": bool(config.scheduler_config.async_scheduling),
            "speculative": None if spec is None else f"{spec.method} k={spec.num_speculative_tokens}",
            "arrivals": "engine iterations",
            # the engine process's string hashing (None: not the pinned seed; VllmEngine pins it)
            "python_hash_seed": HASH_SEED if process_hash_seed_is(HASH_SEED) else None}
        record.prefill_tokens_saved = record.admission_hit_tokens
        record.connector_seconds = sum(self._timings.values())
        if self.connector is None:
            return
        core = getattr(self.connector, "core", None)
        if core is not None:
            record.lifecycle_violations = len(core.manager.violations)
            record.connector_stats = dict(vars(core.stats))
        if record.crash is None and not record.stuck_requests:
            record.leaked_requests = tracked_requests(self.connector) or ()
        handler = transfer_handler(self.worker)
        if handler is not None:  # both built-in workers copy through a FanOutHandler
            (record.store_bytes, record.store_seconds), (record.load_bytes, record.load_seconds) = (
                handler.totals[True], handler.totals[False])

    def unmeasured(self) -> tuple[str, ...]:
        """UNMEASURED, plus what this connector does not expose (as the vllm-scheduler engine)."""
        if self.connector is None:  # offload off: no connector to observe
            return UNMEASURED + ("offload_hit_rate", "last_block_hit_rate", "last_block_eligible", "repeated_lookups",
                                 "lifecycle_violations", "leaked_requests", "connector_us_per_step", "copy_gb_per_s",
                                 "prefill_tokens_saved")
        extra = () if getattr(self.connector, "core", None) is not None else ("lifecycle_violations",)
        if tracked_requests(self.connector) is None:
            extra += ("leaked_requests",)
        measured = () if self.store_delays is None else STORE_SUBMIT_DELAYS
        return tuple(name for name in UNMEASURED if name not in measured) + extra


class _Finished:
    """What AdmissionLedger.parent_finished reads of a finished request: every position but the
    last sampled token's was computed (an aborted one too, as far as it got)."""

    def __init__(self, num_tokens: int, aborted: bool):
        self.num_tokens = num_tokens
        self.num_computed_tokens = num_tokens - 1
        self.status = SimpleNamespace(name="FINISHED_ABORTED" if aborted else "FINISHED_LENGTH_CAPPED")


def replay_pinned(requests, engine: EngineConfig, load: tuple, model: ModelChoice, want_baseline: bool,
                  max_steps: int | None, step_bound_s: float | None = DEFAULT_STEP_BOUND_S, *,
                  on_step=None) -> tuple[ModelRun, ModelRun | None]:
    """One run with ``load`` (source, preset, disabled fixes), then, if wanted and the run did not
    crash, the oracle's offload-off run; ``VllmEngine`` calls it under the pinned hash seed."""
    source, preset, disabled, storage_dir = load
    run = run_on_model(requests, engine, source, model, preset=preset, disabled=disabled, on_step=on_step,
                       max_steps=max_steps, step_bound_s=step_bound_s, storage_dir=storage_dir)
    if not want_baseline or run.record.crash is not None:
        return run, None
    return run, run_on_model(requests, engine, OFF, model, max_steps=max_steps, step_bound_s=step_bound_s)


class VllmEngine:
    """``--engine vllm`` as ``kvoffload.engines`` sees it (registered there by import path).

    ``oracle``: after a run with a connector, check its outputs against an offload-off run of the
    same workload. ``baselines``: a dict shared by the replays of one command (``bench``): an
    ``off`` run stores its outcomes there under the workload, and a later run with a connector
    compares against them instead of starting another engine.

    Every run is under ``PYTHONHASHSEED=HASH_SEED`` (``pinned.py``: in a child interpreter when this
    one hashes otherwise), as the vllm-scheduler engine's, and the result's config records it:
    vLLM hands the connector finished requests as a string set, whose order decides evictions
    (docs/fidelity.md, "finish order"), so the same command gives the same hits and delays.
    """

    unmeasured = UNMEASURED
    recorded = {"python_hash_seed": HASH_SEED}  # goes into the result's config
    step_bound_s: float | None = DEFAULT_STEP_BOUND_S

    def __init__(self, model: str | None = None, oracle: bool = True, baselines: dict | None = None) -> None:
        self.model = ModelChoice.named(model)
        self.oracle = oracle
        self.baselines = {} if baselines is None else baselines
        self.last_run: ModelRun | None = None

    def replay(self, workload, choice, on_step, trace, max_steps) -> RunRecord:
        if trace:
            raise ConfigError("--trace needs the simulator: the vllm engine does not record jobs")
        if workload.reset_cache_at:
            raise ConfigError(f"{workload.name}: [resets] needs --engine simulator or vllm-scheduler: the vllm "
                              "engine does not reset the cache between its iterations")
        key = (workload.name, workload.seed, str(workload.source))
        want_baseline = choice.source != OFF and self.oracle and key not in self.baselines
        run, baseline = call_pinned(replay_pinned, workload.requests, workload.engine,
                                    choice.load(), self.model, want_baseline,
                                    max_steps, self.step_bound_s, on_step=on_step, bound_s=self.step_bound_s)
        self.last_run = run
        self.unmeasured = run.unmeasured  # this instance serves one replay (engines.engine_named)
        run.record.engine_start_seconds = run.start_seconds
        if baseline is not None:
            self.baselines[key] = baseline
        if choice.source == OFF:
            self.baselines[key] = run
        elif self.oracle and run.record.crash is None:
            baseline = self.baselines[key]
            report = compare_outputs(run.outcomes, baseline.outcomes, tokens_per_chunk=run.engine.tokens_per_chunk,
                                     tolerance=self.model.logprob_tolerance)
            run.record.oracle = report.as_dict()
        return run.record
