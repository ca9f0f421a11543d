"""The connector's scheduler side on its hot path: ``build_connector_meta`` for a decoding batch.

256 running requests, past their prefill, decode one token per step. Prompt lengths differ, so
every step a few requests complete a chunk and get a store job, while the rest only advance.
:class:`DecodeBatch` plays the engine: it allocates blocks, advances computed tokens, samples a
token, and reports the previous step's stores complete, as the engine would with a one-step
copy latency. Only ``build_connector_meta`` is timed.

Target: under 200 µs per step for 256 requests (blocks_per_chunk 1 and 4).
Run without asv for a quick look: ``python benchmarks/bench_connector.py``.
"""

from __future__ import annotations

import gc
import random
import sys
import time

from kvoffload.core.fixes import Fixes
from kvoffload.core.request import Request
from kvoffload.core.scheduler import ReferenceConnectorScheduler
from kvoffload.core.types import (
    ConnectorConfig,
    RequestStatus,
    SchedulerOutput,
    StepPlan,
    TransferResult,
    cdiv,
)

try:
    from .samples import asv_samples
except ImportError:  # run as a script (python benchmarks/bench_connector.py): no package around it
    from samples import asv_samples

BLOCK_SIZE = 16
VOCAB = 32000


class DecodeBatch:
    """A scripted engine around a ReferenceConnectorScheduler: ``num_requests`` decoding requests.

    One decode step is ``prepare_step()`` (the schedule: one token per request, a new block where
    the next position starts one), ``connector.build_connector_meta(out)``, then
    ``finish_step(plan)`` (computed tokens advance, a token is sampled, the previous plan's stores
    complete).
    """

    def __init__(self, num_requests: int = 256, blocks_per_chunk: int = 1, *, prompt_len: tuple[int, int] = (256, 768),
                 cpu_chunks: int = 16384, seed: int = 0):
        rng = random.Random(seed)
        self.config = ConnectorConfig(block_size=BLOCK_SIZE, blocks_per_chunk=blocks_per_chunk, cpu_chunks=cpu_chunks)
        self.connector = ReferenceConnectorScheduler(self.config, Fixes())
        self.rng = rng
        self.step_index = 0
        self._next_block = 1  # block 0 is the null block
        self._pending_store_jobs: tuple[int, ...] = ()
        self.requests: list[Request] = []
        self.block_tables: dict[str, list[int]] = {}
        for i in range(num_requests):
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(*prompt_len))]
            req = Request(f"req-{i}", prompt, BLOCK_SIZE)
            self.connector.on_new_request(req)
            hits, _ = self.connector.get_num_new_matched_tokens(req, 0)
            assert hits == 0, "empty tier: nothing to load"
            blocks = self._allocate(cdiv(req.num_tokens, BLOCK_SIZE))
            self.connector.update_state_after_alloc(req, blocks, 0)
            self.block_tables[req.req_id] = blocks
            self.requests.append(req)
        # One prefill step for the whole batch: stores every full prompt chunk.
        prefill = SchedulerOutput(
            step=self._take_step(),
            num_scheduled_tokens={r.req_id: r.num_tokens for r in self.requests},
            new_block_ids={r.req_id: tuple(self.block_tables[r.req_id]) for r in self.requests})
        self.finish_step(self.connector.build_connector_meta(prefill), prefill)

    def _allocate(self, count: int) -> list[int]:
        blocks = list(range(self._next_block, self._next_block + count))
        self._next_block += count
        return blocks

    def _take_step(self) -> int:
        step = self.step_index
        self.step_index += 1
        return step

    def prepare_step(self) -> SchedulerOutput:
        """The schedule of one decode step: every request computes its last sampled token."""
        new_blocks: dict[str, tuple[int, ...]] = {}
        for req in self.requests:
            table = self.block_tables[req.req_id]
            if req.num_computed_tokens + 1 > len(table) * BLOCK_SIZE:
                block = self._allocate(1)
                table.extend(block)
                new_blocks[req.req_id] = tuple(block)
        return SchedulerOutput(step=self._take_step(), num_scheduled_tokens=dict.fromkeys(self.block_tables, 1),
                               new_block_ids=new_blocks)

    def finish_step(self, plan: StepPlan, out: SchedulerOutput) -> None:
        """After the forward: computed tokens advance, one token is sampled per request, and the
        stores of the previous plan report complete."""
        by_id = {req.req_id: req for req in self.requests}
        for req_id, n in out.num_scheduled_tokens.items():
            req = by_id[req_id]
            req.num_computed_tokens += n
            req.status = RequestStatus.RUNNING
            req.append_tokens((self.rng.randrange(VOCAB),))
        self.connector.update_connector_output(TransferResult(job_id) for job_id in self._pending_store_jobs)
        self._pending_store_jobs = tuple(job.job_id for job in plan.store_jobs)

    def expected_store_chunks(self) -> dict[str, tuple[int, ...]]:
        """Before a decode step: the chunk each request completes in it (its position closes one)."""
        tpc = self.config.tokens_per_chunk
        return {req.req_id: ((req.num_computed_tokens + 1) // tpc - 1,) for req in self.requests
                if (req.num_computed_tokens + 1) % tpc == 0}

    def step(self) -> tuple[StepPlan, float]:
        """One decode step; returns its plan and the seconds spent in build_connector_meta."""
        out = self.prepare_step()
        start = time.perf_counter()
        plan = self.connector.build_connector_meta(out)
        elapsed = time.perf_counter() - start
        self.finish_step(plan, out)
        return plan, elapsed


def us_per_step(batch: DecodeBatch, steps: int) -> float:
    """Mean microseconds in build_connector_meta over ``steps`` decode steps."""
    return sum(batch.step()[1] for _ in range(steps)) * 1e6 / steps


class BuildConnectorMeta:
    """µs per decode step in build_connector_meta: 256 running requests, one token each."""

    params = [[1, 4]]
    param_names = ["blocks_per_chunk"]
    timeout = 120
    # 2: repeated samples with asv's statistics (median of `repeat` means); 1 was the best of three
    version = "2"
    num_requests = 256
    steps = 256  # four chunk cycles at blocks_per_chunk 4: store jobs in their steady share
    warmup_steps = 32
    repeat = 9  # samples per process; a sample is the mean over `steps` steps

    def setup(self, blocks_per_chunk):
        self.batch = DecodeBatch(self.num_requests, blocks_per_chunk)
        us_per_step(self.batch, self.warmup_steps)
        # As vLLM's engine does after startup: long-lived state leaves the collector's scans.
        gc.collect()
        gc.freeze()

    def teardown(self, blocks_per_chunk):
        gc.unfreeze()

    def samples(self) -> list[float]:
        """``repeat`` means over ``steps`` steps each: a mean keeps the store steps' share, the
        repeats show how much another process or the collector moved it."""
        return [us_per_step(self.batch, self.steps) for _ in range(self.repeat)]

    def track_us_per_step(self, blocks_per_chunk):
        """Median µs per step of the samples, with their spread (asv's statistics)."""
        return asv_samples(self.samples())

    track_us_per_step.unit = "µs/step"


if __name__ == "__main__":
    if sys.argv[1:]:
        print("usage: python benchmarks/bench_connector.py  (no arguments)", file=sys.stderr)
        sys.exit(2)
    for bpc in BuildConnectorMeta.params[0]:
        bench = BuildConnectorMeta()
        bench.setup(bpc)
        samples = sorted(bench.samples())
        print(f"blocks_per_chunk {bpc}: build_connector_meta {samples[len(samples) // 2]:.1f} µs/step "
              f"(median of {len(samples)} means over {bench.steps} steps, {bench.num_requests} requests; "
              f"range {samples[0]:.1f}-{samples[-1]:.1f})")
