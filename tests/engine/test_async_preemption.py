"""A preempted async request's in-flight output (docs/engine.md, "Preemption under async scheduling").

vLLM 0.32 marks a preempted request's in-flight tokens stale (``Scheduler._preempt_request``:
``num_stale_output_tokens = num_in_flight_tokens``), delivers them when their step is processed
(``update_from_output`` drains the stale share; ``drop_stale_output`` only for
``reset_running_requests`` and connectors that ``requires_kv_delivery``, which the offloading
connector does not), and keeps the request out of admission until they arrived (``schedule()``:
``if request.num_stale_output_tokens and not request.drop_stale_output: skip_request``).

With a KV-consuming connector under async scheduling (``defer_block_free``) that state is never
entered: a request scheduled in the unprocessed step is not a preemption victim
(``_request_blocks_can_be_freed``), and a request with tokens in flight is exactly one scheduled in
the unprocessed step. The engine always runs a connector, so it models the victim rule and no
stale output. These runs hold it to that: tiny pools, many requests, preemption on nearly every
run, with connector hits (loads in flight) and with a connector that never hits.
"""

from __future__ import annotations

import random

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import cdiv
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.cost import profile
from kvoffload.engine.engine import Engine
from kvoffload.engine.live import LiveRequest
from kvoffload.engine.observer import RunObserver
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.scheduler import SchedulerModel, StepOutput

SEEDS = range(24)
MAX_STEPS = 3000  # far above any scenario here (a few hundred steps), far below a hang


def scenario(seed: int) -> tuple[EngineConfig, list[RequestSpec]]:
    """A tight pool and a crowd: 8-14 requests, some extending an earlier one (connector hits)."""
    rng = random.Random(seed)
    requests: list[RequestSpec] = []
    for index in range(rng.randint(10, 16)):
        parent = rng.choice(requests) if requests and rng.random() < 0.4 else None
        base = parent.prompt_token_ids + parent.output_token_ids if parent else ()
        prompt = base + tuple(rng.randint(3, 30000) for _ in range(rng.randint(2, 16)))
        output = tuple(rng.randint(3, 30000) for _ in range(rng.randint(2, 10)))
        requests.append(RequestSpec(f"r{index}", prompt, output, stop=rng.choice(["eos", "length"]),
                                    arrival_step=rng.randint(0, 8), parent=parent.req_id if parent else None,
                                    think_steps=rng.randint(0, 2)))
    longest = max(r.num_prompt_tokens + r.max_tokens for r in requests)
    config = EngineConfig(gpu_blocks=cdiv(longest, 4) + 1 + rng.randint(0, 2), cpu_chunks=64, block_size=4,
                          max_num_seqs=rng.randint(3, 8), max_num_batched_tokens=rng.choice([8, 16, 64]),
                          scheduling="async", store_completion_steps=rng.randint(0, 3),
                          reserve_full_isl=rng.random() < 0.5, seed=seed)
    return config, requests


class PreemptionWatch:
    """Wraps the scheduler's ``_preempt`` and notes, per preemption, whether the victim had work in
    flight: a step that scheduled it and is not processed yet, or a sample not yet applied."""

    def __init__(self, scheduler: SchedulerModel):
        self.scheduler = scheduler
        self.preemptions = 0
        self.with_output_in_flight: list[tuple[str, int, int]] = []
        self._preempt = scheduler._preempt
        scheduler._preempt = self

    def __call__(self, live: LiveRequest) -> None:
        self.preemptions += 1
        if live.last_scheduled_seq > self.scheduler.processed_seq or live.pending_outputs:
            self.with_output_in_flight.append((live.req_id, live.last_scheduled_seq, live.pending_outputs))
        self._preempt(live)


def test_the_engine_never_preempts_a_request_with_output_in_flight():
    """The reference connector, loads in flight, follow-ups served from the tier."""
    preemptions = loads = 0
    for seed in SEEDS:
        config, requests = scenario(seed)
        engine = Engine(requests, config, Fixes(), strict=True, max_steps=MAX_STEPS)
        watch = PreemptionWatch(engine.scheduler)
        record = engine.run()
        assert watch.with_output_in_flight == [], seed
        assert (record.crash, record.stuck_requests, record.poisoned) == (None, (), []), seed
        assert record.finished_requests == len(requests), seed
        preemptions += watch.preemptions
        loads += record.connector_hit_tokens_admitted > 0
    assert preemptions >= len(SEEDS) and loads >= len(SEEDS) // 2  # the property was exercised


class NeverHits:
    """A connector that is there (so vLLM would defer block frees) but never has a hit."""

    def on_new_request(self, req) -> None:
        pass

    def get_num_new_matched_tokens(self, req, num_local):
        return 0, False

    def update_state_after_alloc(self, req, block_ids, num_external_tokens) -> None:
        pass

    def request_finished(self, req, block_ids=()) -> bool:
        return False


def drive(scheduler: SchedulerModel, requests: list[RequestSpec]) -> int:
    """vLLM's async loop with a batch queue of depth 2: schedule N+1, then process N's output."""
    arrivals = sorted(requests, key=lambda r: r.arrival_step)
    in_flight: StepOutput | None = None
    step = 0
    while (arrivals or scheduler.live or in_flight) and step < MAX_STEPS:
        while arrivals and arrivals[0].arrival_step <= step:
            scheduler.add(LiveRequest.create(arrivals.pop(0), scheduler.config.block_size, step))
        _, scheduled, _ = scheduler.schedule(step)
        scheduler.after_schedule(scheduled)
        if in_flight is not None:
            scheduler.update_from_output(in_flight)
        in_flight = StepOutput(step, tuple(scheduled), ()) if scheduled else None
        step += 1
    return step


def test_the_scheduler_never_preempts_a_request_with_output_in_flight_without_connector_hits():
    preemptions = 0
    for seed in SEEDS:
        config, requests = scenario(seed)
        requests = [r if r.parent is None else RequestSpec(r.req_id, r.prompt_token_ids, r.output_token_ids,
                                                           arrival_step=r.arrival_step + 4) for r in requests]
        observer = RunObserver(profile(config.profile), config.block_size, config.tokens_per_chunk, trace=False)
        scheduler = SchedulerModel(config, BlockPool(config.gpu_blocks, config.block_size), NeverHits(),
                                   observer, on_finished=lambda live, step: None)
        watch = PreemptionWatch(scheduler)
        steps = drive(scheduler, requests)
        assert watch.with_output_in_flight == [], seed
        assert steps < MAX_STEPS and not scheduler.live, seed
        assert len(scheduler.finished) == len(requests), seed
        preemptions += watch.preemptions
    assert preemptions >= len(SEEDS)
