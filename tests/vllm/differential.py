"""One differential replay: a workload through the simulator and through vLLM's scheduler, each
connector observed from its scheduler side. Run under the pinned hash seed
(``kvoffload.vllm.pinned.call_pinned``: in a child interpreter when the test's own process hashes
strings otherwise), so it returns plain data only."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.core.fixes import Fixes
from kvoffload.engine.engine import Engine
from kvoffload.vllm.build import ConnectorLoad
from kvoffload.vllm.replay import VllmSchedulerReplay
from kvoffload.workloads import load_workload
from observations import CoreObservations, observe_core


@dataclass
class Side:
    """One engine's view of the replay."""

    totals: tuple  # steps, GPU-hit and connector-hit tokens, preemptions, chunks stored and loaded, flushed jobs
    per_request: dict[str, tuple]  # first admission (GPU hit, connector hit), chunks stored, chunks loaded
    steps: dict[int, tuple]  # step -> (tokens per request, free GPU blocks after the schedule)
    crash: str | None
    store_submit_delays: tuple[int, ...] = ()  # sorted: steps from fully written to the store's submission


def compare(name: str, scheduling: str, settings: dict[str, str], stock: bool = False, *,
            on_step=None) -> tuple[list[str], Side, Side, dict[str, tuple] | None]:
    """Request ids, the simulator's side, vLLM's side (the reference connector), and, with
    ``stock``, vLLM's own connector's first admissions per request."""
    workload = load_workload(name, {"scheduling": scheduling, **settings})
    simulator = Engine(workload.requests, workload.engine, Fixes(), reset_cache_at=workload.reset_cache_at)
    sim = observe_core(simulator.connector)
    sim_steps = record_schedules(simulator.scheduler, lambda out: out[0].step,
                                 lambda out: out[0].num_scheduled_tokens, simulator.pool, lambda pool: pool.num_free)
    sim_side = side(simulator.run(), sim, sim_steps, workload)
    replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad("reference"),
                                 reset_cache_at=workload.reset_cache_at)
    real = observe_core(replay.scheduler.connector.core)
    vllm_steps = record_schedules(replay.scheduler, lambda out: replay._step, lambda out: out.num_scheduled_tokens,
                                  replay.scheduler.kv_cache_manager.block_pool,
                                  lambda pool: pool.get_num_free_blocks())
    vllm_side = side(replay.run(), real, vllm_steps, workload)
    stock_admissions = None
    if stock:
        stock_replay = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad("stock"),
                                           reset_cache_at=workload.reset_cache_at)
        stock_record = stock_replay.run()
        assert stock_record.crash is None, stock_record.crash
        stock_admissions = dict(stock_replay.ledger.first_admission)
    return [spec.req_id for spec in workload.requests], sim_side, vllm_side, stock_admissions


def compare_opted_in(name: str, scheduling: str, settings: dict[str, str], *, on_step=None):
    """:func:`compare` with the reference opted in to a hybrid's divergent local hits
    (``supports_divergent_local_hybrid_hits``, vLLM 0.28+) in both engines: its scheduler side
    in the simulator, its connector in vLLM's scheduler; the classes are restored after."""
    from kvoffload.core.hybrid import HybridConnectorScheduler
    from kvoffload.vllm.connector import KVOffloadConnector

    classes = (HybridConnectorScheduler, KVOffloadConnector)
    for cls in classes:
        cls.supports_divergent_local_hybrid_hits = True
    try:
        return compare(name, scheduling, settings, on_step=on_step)
    finally:
        for cls in classes:
            del cls.supports_divergent_local_hybrid_hits


def store_delays(requests, engine, *, on_step=None) -> tuple[list[int], list[int]]:
    """The store submission delays, in submission order, of ``requests`` through the simulator
    and through vLLM's scheduler (the reference connector)."""
    simulated = Engine(requests, engine, Fixes()).run()
    real = VllmSchedulerReplay(requests, engine, ConnectorLoad("reference")).run()
    assert simulated.crash is None and real.crash is None, (simulated.crash, real.crash)
    return simulated.store_submit_delays, real.store_submit_delays


def side(record, seen: CoreObservations, steps: dict, workload) -> Side:
    totals = (record.steps, record.gpu_hit_tokens, record.connector_hit_tokens_admitted, record.preemptions,
              sum(seen.chunks_stored.values()), sum(seen.chunks_loaded.values()), len(seen.flushed_jobs))
    return Side(totals, {spec.req_id: seen.of(spec.req_id) for spec in workload.requests}, steps, record.crash,
                tuple(sorted(record.store_submit_delays)))


def record_schedules(scheduler, step_of, tokens_of, pool, num_free) -> dict[int, tuple]:
    """Wrap ``scheduler.schedule``: per step that schedules tokens, (tokens per request, free
    blocks after the schedule)."""
    steps: dict[int, tuple] = {}
    schedule = scheduler.schedule

    def recorded(*args):
        out = schedule(*args)
        if tokens_of(out):
            steps[step_of(out)] = (dict(tokens_of(out)), num_free(pool))
        return out

    scheduler.schedule = recorded
    return steps
