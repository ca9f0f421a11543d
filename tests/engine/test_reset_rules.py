"""Resetting the caches as vLLM 0.32 does, one story each (docs/engine.md, "Resetting the caches").

The engine follows ``Scheduler.reset_prefix_cache(reset_running_requests=False,
reset_connector=True)``, what ``LLM.reset_prefix_cache(reset_connector=True)`` and
``POST /reset_prefix_cache?reset_external=true`` ask for: nothing is preempted, the GPU prefix
cache is reset only while no block is in use (``BlockPool.reset_prefix_cache``), the connector's
cache is reset whatever the GPU answered, and the caller gets True only when both were. Block
size 4 throughout.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import RequestStatus, TransferKind
from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.cost import profile
from kvoffload.engine.engine import Engine, replay
from kvoffload.engine.live import LiveRequest, Phase
from kvoffload.engine.observer import RunObserver
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.scheduler import SchedulerModel, StepOutput
from never_hits import NeverHits

BS = 4
TINY = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))


class ResettableConnector(NeverHits):
    """No hits; counts the resets it was asked for and answers ``answer``."""

    def __init__(self, answer: bool | None = True):
        self.answer = answer
        self.resets = 0

    def reset_cache(self):
        self.resets += 1
        return self.answer


def model(connector=None, **settings) -> SchedulerModel:
    config = EngineConfig(gpu_blocks=settings.pop("gpu_blocks", 16), block_size=BS, **settings)
    observer = RunObserver(profile(config.profile), BS, config.tokens_per_chunk, trace=False)
    return SchedulerModel(config, BlockPool(config.gpu_blocks, BS), connector or ResettableConnector(),
                          observer, on_finished=lambda live, step: None)


def arrive(scheduler: SchedulerModel, req_id: str, prompt: tuple[int, ...], output: int = 4) -> LiveRequest:
    live = LiveRequest.create(RequestSpec(req_id, prompt, tokens(99, output)), BS, 0)
    scheduler.add(live)
    return live


def step(scheduler: SchedulerModel, number: int = 0):
    """Schedule one step; under sync scheduling its output is processed at once."""
    out, scheduled, _ = scheduler.schedule(number)
    scheduler.after_schedule(scheduled)
    if scheduler.config.scheduling == "sync":
        scheduler.update_from_output(StepOutput(number, tuple(scheduled), ()))
    return out, scheduled


def cached_blocks_of(scheduler: SchedulerModel, live: LiveRequest) -> int:
    return len(scheduler.pool.cached_prefix(live.req.block_hashes, len(live.req.block_hashes)))


class TestBlockPoolReset:
    def test_refused_while_a_block_is_in_use_and_the_cache_is_left_as_it_was(self):
        """BlockPool.reset_prefix_cache: ``if num_used_blocks != 1: return False`` -- before any
        hash is touched, so the free cached blocks stay findable too."""
        pool = BlockPool(8, BS)
        held, freed = pool.allocate(1), pool.allocate(1)
        pool.commit(held, [b"held"], 0, 1)
        pool.commit(freed, [b"freed"], 0, 1)
        pool.free(freed)
        assert pool.reset_prefix_cache() is False
        assert pool.cached_prefix([b"freed"], 1) == freed and pool.cached_prefix([b"held"], 1) == held

    def test_with_every_block_free_every_hash_goes(self):
        pools = []
        for _ in range(2):
            pool = BlockPool(8, BS)
            blocks = pool.allocate(3)
            pool.commit(blocks, [b"a", b"b", b"c"], 0, 3)
            pool.free(blocks)
            pools.append(pool)
        reset, untouched = pools
        assert reset.reset_prefix_cache() is True
        assert reset.cached_prefix([b"a", b"b", b"c"], 3) == []
        assert untouched.cached_prefix([b"a", b"b", b"c"], 3) == blocks
        reset.check_invariants(blocks_in_use=0)
        assert reset.allocate(7) == untouched.allocate(7)  # the free queue keeps its order


class TestSchedulerReset:
    def test_a_running_request_keeps_running_and_the_gpu_cache_is_kept_but_the_connector_is_reset(self):
        """reset_running_requests=False: no preemption; ``reset_connector_cache() and
        reset_successful`` calls the connector first, so it is reset although the answer is False."""
        scheduler = model()
        running = arrive(scheduler, "R", tokens(1, 8))
        step(scheduler)
        assert scheduler.reset_prefix_cache() is False
        assert scheduler.connector.resets == 1
        assert running.phase is Phase.RUNNING and running.req.num_tokens == 9
        assert cached_blocks_of(scheduler, running) == 2
        out, _ = step(scheduler, 1)
        assert out.num_scheduled_tokens == {"R": 1} and out.preempted_req_ids == ()

    def test_an_idle_scheduler_resets_both(self):
        scheduler = model()
        done = arrive(scheduler, "D", tokens(1, 8))
        step(scheduler)
        scheduler.finish(done, RequestStatus.FINISHED_LENGTH, 0)
        assert cached_blocks_of(scheduler, done) == 2
        assert scheduler.reset_prefix_cache() is True
        assert cached_blocks_of(scheduler, done) == 0 and scheduler.connector.resets == 1

    def test_a_connector_that_refuses_fails_the_reset(self):
        """reset_connector_cache: ``if self.connector.reset_cache() is False: return False``."""
        scheduler = model(ResettableConnector(answer=False))
        assert scheduler.reset_prefix_cache() is False
        scheduler.connector.answer = None  # vLLM's base connector answers None: not a refusal
        assert scheduler.reset_prefix_cache() is True

    def test_blocks_whose_free_is_deferred_are_in_use(self):
        """Async with a connector (defer_block_free): a request finished while its step is in
        flight keeps its blocks out of the pool until the step is processed; the reset is refused
        until then (vLLM's pool counts them used: they were never returned)."""
        scheduler = model(scheduling="async")
        done = arrive(scheduler, "D", tokens(1, 8), output=1)
        _, scheduled = step(scheduler)
        scheduler.finish(done, RequestStatus.FINISHED_ABORTED, 0)
        assert scheduler.reset_prefix_cache() is False
        scheduler.update_from_output(StepOutput(0, tuple(scheduled), ()))
        assert scheduler.reset_prefix_cache() is True


class TestEngineReset:
    """P (8 tokens) finishes early; B repeats P's prompt after a reset at step 4. While R runs
    across the reset, the GPU keeps P's cached blocks and B hits them; with nothing running the
    reset goes through and B computes everything again."""

    @pytest.mark.parametrize("scheduling", ["sync", "async"])
    @pytest.mark.parametrize("busy", [True, False])
    def test_the_gpu_prefix_cache_survives_a_reset_refused_while_a_request_runs(self, scheduling, busy):
        p = RequestSpec("P", tokens(1, 8) + tokens(2, 1), tokens(3, 1))
        b = RequestSpec("B", p.prompt_token_ids, tokens(4, 1), arrival_step=5)
        r = RequestSpec("R", tokens(5, 8), tokens(6, 12), arrival_step=1)
        record = replay([p, b] + ([r] if busy else []), TINY.replace(scheduling=scheduling),
                        Fixes(), reset_cache_at=[4], strict=True)
        assert (record.crash, record.stuck_requests, record.leaked_requests) == (None, (), ())
        assert record.resets == [(4, not busy)]
        assert record.gpu_hit_tokens == (8 if busy else 0)
        assert record.connector_hit_tokens_admitted == 0  # the connector was reset both times


class TestResetWhileAFailedLoadIsInFlight:
    """A (8 tokens) finishes and its two chunks are stored; the GPU cache then forgets A's blocks,
    so C (A's history + 4 tokens) gets 8 tokens from the connector. C's load is in flight when
    reset_cache comes (step 6 sync, 7 async: the copy reports 3 steps later), and the copy fails.
    The reset makes the load's completion stale to the connector's scheduler side, but C's blocks
    still hold garbage: the worker reports them (vLLM's get_block_ids_with_load_errors), and C
    recomputes the 8 tokens exactly as after a failed load without a reset. Found by the fuzzer
    (issue 22): the report used to come from the scheduler side, which dropped it as stale, and
    C ran on with the garbage as its KV."""

    @pytest.mark.parametrize("scheduling, reset_step", [("sync", 6), ("async", 7)])
    @pytest.mark.parametrize("spec_tokens", [0, 1])
    def test_the_garbage_is_recomputed(self, scheduling, reset_step, spec_tokens):
        a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
        c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + tokens(3, 4), tokens(4, 2), parent="A")
        config = TINY.replace(scheduling=scheduling, spec_tokens=spec_tokens, store_completion_steps=3)

        def failed_load_run(reset_at):
            engines = []

            def forget_gpu_cache(next_step, finished):
                if next_step < 6:
                    engines[0].pool.uncache_free_blocks()

            eng = Engine([a, c], config, Fixes(), reset_cache_at=reset_at, strict=True, max_steps=200,
                         on_step=forget_gpu_cache, skip_idle=False)
            engines.append(eng)
            eng.handler.fail_jobs(lambda job: job.kind is TransferKind.LOAD)
            return eng.run(), eng

        without_reset, _ = failed_load_run([])
        record, eng = failed_load_run([reset_step])
        assert record.resets == [(reset_step, False)]  # C holds blocks: the GPU cache stays
        assert len(eng.handler.failed_job_ids) == 1 and record.connector_hit_tokens_admitted == 8
        assert (record.crash, record.poisoned, record.stuck_requests, record.leaked_requests) == (None, [], (), ())
        assert record.finished_requests == 2
        assert record.scheduled_tokens == without_reset.scheduled_tokens  # the 8 failed tokens again
