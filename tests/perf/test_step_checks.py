"""The cheaper engine step keeps its answers: the fence check's kept held-block sets equal the
block tables they stand for, and an invariant the per-step checks no longer cover (they count,
the periodic full checks compare every relation) is still reported, at the next full check."""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine import engine as engine_module
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import Engine
from kvoffload.workloads import load_workload


def small_engine(scheduling: str, **settings) -> Engine:
    workload = load_workload("multi-turn-small", {"scheduling": scheduling, **settings})
    return Engine(workload.requests, workload.engine, Fixes())


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_kept_held_sets_equal_the_block_tables(scheduling):
    # A small pool and slow copies: preemptions give requests new block tables while stores of
    # theirs are still to be copied, so the kept sets must notice a replaced table.
    engine = small_engine(scheduling, gpu_blocks="28", store_completion_steps="6", blocks_per_chunk="1")
    scheduler, asked, last_table, replaced = engine.scheduler, [], {}, []
    kept = scheduler.blocks_held_by

    def checked(req_id):
        held = kept(req_id)
        live = scheduler.live.get(req_id)
        assert set(held) == (set(live.blocks) if live is not None else set())
        if live is not None:
            if req_id in last_table and last_table[req_id] is not live.blocks:
                replaced.append(req_id)
            last_table[req_id] = live.blocks
        asked.append(req_id)
        return held

    scheduler.blocks_held_by = checked
    record = engine.run()
    assert record.crash is None and record.preemptions > 0
    assert len(asked) > 100 and len(set(asked)) > 5  # the fence check asked, for many requests
    assert len(replaced) >= 3  # ... also after a request's table was replaced


def test_a_fence_entry_for_a_gone_job_is_reported_at_the_next_full_check():
    engine = small_engine("async")
    planted_at = 40

    def plant(step, finished):
        if step == planted_at:  # I2: the fence names a job that does not exist
            engine.connector.jobs._store_jobs_by_block[10**6] = {10**6: None}

    engine.on_step = plant
    engine.skip_idle = False
    record = engine.run()
    first = record.invariant_violations[0]
    assert first["rule"] == "connector" and first["message"].startswith("I2")
    assert first["step"] == engine_module.FULL_CHECK_EVERY_STEPS  # the per-step checks are counts only
    assert record.steps > engine_module.FULL_CHECK_EVERY_STEPS > planted_at


def test_a_fenced_block_missing_from_the_fence_index_is_reported_at_the_next_full_check():
    # The reverse of the gone job: a store job still fences a block, but the block -> jobs index
    # forgot it, so a GPU block the copy still reads would be handed out without waiting for it.
    engine = small_engine("async", store_completion_steps="40")  # slow copies: fences outlive a check period
    planted = []

    def plant(step, finished):
        jobs = engine.connector.jobs
        fencing = [job for job in jobs._jobs.values() if job.fenced_blocks]
        if not planted and step >= engine_module.FULL_CHECK_EVERY_STEPS - 10 and fencing:
            job = fencing[0]
            block = min(job.fenced_blocks)
            readers = jobs._store_jobs_by_block[block]
            del readers[job.job_id]
            if not readers:  # an empty entry is a violation of its own: drop it with its last reader
                del jobs._store_jobs_by_block[block]
            planted.append(step)

    engine.on_step = plant
    engine.skip_idle = False
    record = engine.run()
    assert planted and planted[0] < engine_module.FULL_CHECK_EVERY_STEPS
    assert record.invariant_violations, "the lost fence entry went unreported"
    first = record.invariant_violations[0]
    assert first["rule"] == "connector" and first["step"] == engine_module.FULL_CHECK_EVERY_STEPS


def test_a_lost_job_is_reported_at_the_next_step():
    engine = small_engine("async", store_completion_steps="4")
    seen = []

    def plant(step, finished):
        jobs = engine.connector.jobs
        if not seen and jobs._jobs:  # I1: the job table loses a job its request still lists
            seen.append(step)
            del jobs._jobs[next(iter(jobs._jobs))]

    engine.on_step = plant
    engine.skip_idle = False
    record = engine.run()
    first = record.invariant_violations[0] if record.invariant_violations else None
    assert first is not None and first["rule"] == "connector" and first["step"] == seen[0]
    assert first["message"].startswith("I1")


def test_a_store_cursor_moved_past_the_keys_is_reported_in_its_step():
    from kvoffload.core import stores

    engine = small_engine("sync")
    planted = []
    store_request = stores.StorePlanner._store_request

    def overshooting(planner, state, *args):
        before = state.next_stored_chunk
        store_request(planner, state, *args)
        if not planted and state.next_stored_chunk > before and engine._step >= 20:
            planted.append(engine._step)  # a cursor bug: the store path moves it past the keys
            state.next_stored_chunk = len(state.offload_keys) + 3

    stores.StorePlanner._store_request = overshooting
    try:
        record = engine.run()
    finally:
        stores.StorePlanner._store_request = store_request
    first = record.invariant_violations[0]
    assert (first["rule"], first["step"]) == ("connector", planted[0])
    assert first["message"] == "store cursor past the known keys"


def test_without_checks_the_moved_cursors_stay_bounded_and_the_next_check_sees_every_cursor():
    from kvoffload.core import scheduler as connector_module

    workload = load_workload("multi-turn-small", {"scheduling": "sync"})
    engine = Engine(workload.requests, workload.engine, Fixes(), check_invariants=False)
    connector = engine.connector
    connector_module.MOVED_KEPT, kept = 8, connector_module.MOVED_KEPT
    try:
        seen = []
        engine.on_step = lambda step, finished: seen.append(len(connector._cursor_moved))
        engine.run()
    finally:
        connector_module.MOVED_KEPT = kept
    assert max(seen) <= 8 + 64 and connector._check_every_cursor  # overflowed, so: all next time
    connector.check_invariants(full=False)
    assert not connector._check_every_cursor and connector._cursor_moved == []
