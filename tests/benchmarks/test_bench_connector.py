"""build_connector_meta for 256 decoding requests, under pytest-benchmark.

In a normal test run (``--benchmark-disable`` in addopts) each benchmark body runs once and the
assertions still hold. To measure::

    .venv/bin/python -m pytest tests/benchmarks/test_bench_connector.py --benchmark-enable

Only ``build_connector_meta`` is timed: the scripted engine's bookkeeping runs in pedantic's
untimed ``setup``. Every timed step's plan is checked against the chunks the batch completed.
"""

from __future__ import annotations

import gc

import pytest

NUM_REQUESTS = 256
ROUNDS = 256  # one round = one decode step


@pytest.fixture(scope="module")
def module(suite):
    return suite("bench_connector")


class StepChecker:
    """Runs the batch one step at a time around pedantic's timed call and checks each plan."""

    def __init__(self, batch):
        self.batch = batch
        self.pending = None  # (out, expected) of the step whose plan is being built
        self.plans = []
        self.steps_checked = 0

    def setup(self):
        self.settle()
        expected = self.batch.expected_store_chunks()
        out = self.batch.prepare_step()
        self.pending = (out, expected)
        return (out,), {}

    def build(self, out):
        plan = self.batch.connector.build_connector_meta(out)
        self.plans.append(plan)
        return plan

    def settle(self):
        """Check the plan of the pending step and let the engine finish that step."""
        if self.pending is None:
            return
        out, expected = self.pending
        plan = self.plans[-1]
        stored = {job.req_id: job.chunk_indices for job in plan.store_jobs}
        assert stored == expected, f"step {out.step}: stores {stored}, expected {expected}"
        assert not plan.load_jobs and not plan.jobs_to_flush
        self.batch.finish_step(plan, out)
        self.steps_checked += 1
        self.pending = None


@pytest.mark.parametrize("blocks_per_chunk", [1, 4])
def test_build_connector_meta_256_decoding(benchmark, module, blocks_per_chunk):
    batch = module.DecodeBatch(NUM_REQUESTS, blocks_per_chunk)
    module.us_per_step(batch, 16)  # past the prefill's completions
    checker = StepChecker(batch)
    benchmark.extra_info["requests"] = NUM_REQUESTS
    gc.collect()
    gc.freeze()  # as vLLM's engine does after startup: long-lived state leaves the collector's scans
    try:
        benchmark.pedantic(checker.build, setup=checker.setup, rounds=ROUNDS, iterations=1)
    finally:
        gc.unfreeze()
    checker.settle()
    assert checker.steps_checked >= 1
    # With --benchmark-disable pedantic runs one round: the rest run untimed, checked the same way,
    # so every run covers ROUNDS steps and every request completes its chunks.
    while checker.steps_checked < ROUNDS:
        checker.build(*checker.setup()[0])
        checker.settle()
    assert checker.steps_checked == ROUNDS
    tpc = batch.config.tokens_per_chunk
    stores = sum(len(plan.store_jobs) for plan in checker.plans)
    assert NUM_REQUESTS * (ROUNDS // tpc) <= stores <= NUM_REQUESTS * -(-ROUNDS // tpc)


@pytest.mark.parametrize("blocks_per_chunk", [1, 4])
def test_the_prefill_stored_every_full_prompt_chunk(module, blocks_per_chunk):
    batch = module.DecodeBatch(16, blocks_per_chunk)
    tpc = batch.config.tokens_per_chunk
    for req in batch.requests:
        assert batch.connector.next_stored_chunk(req.req_id) == req.num_prompt_tokens // tpc
    # the next steps store exactly the chunks that decode completes, each once
    for _ in range(2 * tpc):
        expected = batch.expected_store_chunks()
        plan, _ = batch.step()
        assert {job.req_id: job.chunk_indices for job in plan.store_jobs} == expected
    batch.connector.check_invariants()


def test_asv_class_runs_once_with_tiny_parameters(module, methods_of):
    class Tiny(module.BuildConnectorMeta):
        num_requests, steps, warmup_steps = 8, 16, 2

    assert methods_of(module.BuildConnectorMeta) == ["track_us_per_step"]
    for bpc in module.BuildConnectorMeta.params[0]:
        bench = Tiny()
        bench.setup(bpc)
        record = bench.track_us_per_step(bpc)
        bench.teardown(bpc)
        # asv's timing record: it keeps the median and the spread of these samples
        assert record["number"] == 1 and len(record["samples"]) == Tiny.repeat
        assert all(us > 0 for us in record["samples"])
