"""What a run records besides the KV content: the observer behind :class:`RunRecord`.

It notes each first admission (hit tokens, continuations), when every chunk's KV was fully
written and when its store was submitted and became visible (store delays), the transfer trace,
the modelled step time, the wall time spent inside connector calls, and the result of every
invariant check. It decides nothing: the scheduler model and the engine call it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from kvoffload.core.types import RequestStatus, StepPlan, TransferJob, TransferResult, cdiv
from kvoffload.engine.cost import HardwareProfile
from kvoffload.engine.live import LiveRequest
from kvoffload.engine.record import RunRecord, continuation, last_written_chunk_end

# An idle gap up to this many steps is charged one step at a time (bit-equal to walking it).
EXACT_IDLE_STEPS = 2**22


@dataclass(slots=True)
class OpenStore:
    """A store job from its plan until its completion is processed."""

    job: TransferJob
    written_at: list[int]  # per chunk: the step its KV was fully written
    submitted: bool = False  # handed to the transfer handler


# Failed invariant checks kept with their step and rule (all are counted).
FIRST_VIOLATIONS_KEPT = 5


class RunObserver:
    def __init__(self, profile: HardwareProfile, block_size: int, tokens_per_chunk: int, trace: bool):
        self.record = RunRecord()
        self.profile = profile
        self.block_size = block_size
        self.tokens_per_chunk = tokens_per_chunk
        self.trace = trace
        self.step = 0  # the engine step in progress
        self.open_stores: dict[int, OpenStore] = {}  # store job id -> (built, completion unprocessed)
        # request -> chunk -> step fully written; per request, so a finish or a re-admission drops them at once
        self._chunk_written_at: dict[str, dict[int, int]] = {}
        self._forget_after_plan: list[str] = []  # finished requests
        self.watchdog = None  # the engine's ProgressWatchdog: told of every preemption
        self.final_chunks = None  # the engine's FinalChunkWatch: told of every finish and store

    def timed(self, call, *args):
        """Call a connector method, adding its wall time to ``connector_seconds``."""
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.record.connector_seconds += time.perf_counter() - started

    # ---- requests ---------------------------------------------------------------------------

    def arrived(self, live: LiveRequest) -> None:
        self.record.requests += 1
        self.record.prompt_tokens += live.spec.num_prompt_tokens

    def admitted(self, live: LiveRequest, num_local: int, hits: int, parent: LiveRequest | None) -> None:
        """An admission through a lookup: every one counts for offload_hit_rate; the first also for
        the GPU hit rate and, for a follow-up, whether it continues its parent."""
        record = self.record
        record.admissions += 1
        record.admission_asked_tokens += live.req.num_tokens - num_local
        record.admission_hit_tokens += hits
        if live.admitted:
            # A re-admission after preemption: the request's blocks are handed to it anew, its
            # chunks recomputed by this step's forward or GPU prefix-cache hits. What it wrote
            # before no longer counts; its stores count from their plan, as a block handed to
            # a request counts on vLLM's scheduler (kvoffload.vllm.observe.StoreSubmitDelays).
            self._chunk_written_at.pop(live.req_id, None)
            return
        live.admitted = True
        record.gpu_hit_tokens += num_local
        record.admitted_prompt_tokens += live.req.num_tokens
        record.connector_hit_tokens_admitted += hits
        if parent is None:
            return
        last_chunk_end = last_written_chunk_end(parent.req.num_tokens, parent.req.num_computed_tokens,
                                                parent.status is RequestStatus.FINISHED_ABORTED,
                                                self.tokens_per_chunk)
        follow_up = continuation(live.req_id, parent.req_id, live.spec.prompt_token_ids, parent.truth,
                                 last_chunk_end, num_local, hits)
        if follow_up is not None:
            record.continuations.append(follow_up)

    def looked_up(self, num_tokens: int) -> None:
        """get_num_new_matched_tokens answered (not deferred) about ``num_tokens`` tokens."""
        self.record.connector_lookups += 1
        self.record.connector_lookup_tokens += num_tokens

    def preempted(self, live: LiveRequest) -> None:
        self.record.preemptions += 1
        if self.watchdog is not None:
            self.watchdog.preempted(live.req_id)

    def sampled(self, count: int) -> None:
        self.record.output_tokens += count

    def finished(self, live: LiveRequest) -> None:
        self.record.finished_requests += 1
        if self.final_chunks is not None:
            self.final_chunks.finished(live, live.status is RequestStatus.FINISHED_ABORTED)
        # Its chunks' write steps are read by its last store job, which the next plan builds at
        # the latest (the deferred final store, vLLM PR #48596): forgotten after that plan, so
        # this map follows live requests, not the trace.
        self._forget_after_plan.append(live.req_id)

    # ---- the forward and the stores ---------------------------------------------------------

    def forward_written(self, step: int, scheduled: Sequence) -> None:
        """Chunks whose last slot now holds valid KV (a rejected draft's KV does not count)."""
        tpc = self.tokens_per_chunk
        written_at = self._chunk_written_at
        for item in scheduled:
            start, end = item.start, item.start + item.num_tokens
            valid_end = start + 1 + item.accepted if item.num_tokens > 1 and not item.prefill else end
            first = cdiv(start + 1, tpc) - 1
            if first < valid_end // tpc:
                chunks = written_at.setdefault(item.live.req_id, {})
                for chunk in range(first, valid_end // tpc):
                    chunks[chunk] = step

    def plan_built(self, plan: StepPlan, step: int) -> None:
        for job in plan.store_jobs:
            written = self._chunk_written_at.get(job.req_id, {})
            self.open_stores[job.job_id] = OpenStore(job, [written.get(chunk, step) for chunk in job.chunk_indices])
        if self._forget_after_plan:
            for req_id in self._forget_after_plan:
                self._chunk_written_at.pop(req_id, None)
            self._forget_after_plan = []
        if self.trace:
            for job in plan.load_jobs + plan.store_jobs:
                args = {"chunks": list(job.chunk_indices), "flushed": job.job_id in plan.jobs_to_flush}
                if job.chunk_groups:  # a hybrid model: the KV cache group of each chunk
                    args["groups"] = list(job.chunk_groups)
                self.record.trace_events.append({"name": f"{job.kind.value} {job.job_id}", "ph": "i", "s": "t",
                                                 "ts": step, "pid": 0, "tid": job.req_id, "args": args})

    def store_submitted(self, job: TransferJob) -> None:
        """The worker's hook: a store job reached the transfer handler."""
        store = self.open_stores[job.job_id]
        store.submitted = True
        self.record.store_submit_delays.extend(self.step - written for written in store.written_at)

    def unsubmitted(self, jobs: Sequence[TransferJob]) -> list[TransferJob]:
        """Those of ``jobs`` not handed to the handler yet (a completed job was submitted)."""
        open_stores = self.open_stores
        return [job for job in jobs
                if job.job_id in open_stores and not open_stores[job.job_id].submitted]

    def store_completed(self, result: TransferResult, step: int) -> bool:
        """A completion was processed; False if it was not a store's."""
        store = self.open_stores.pop(result.job_id, None)
        if store is None:
            return False
        if self.final_chunks is not None and result.success:
            self.final_chunks.stored(store.job)
        self.record.store_visible_delays.extend(step - written for written in store.written_at)
        return True

    # ---- cost model ---------------------------------------------------------------------------

    def idle_steps(self, count: int) -> None:
        """``count`` steps with nothing scheduled or moved: the step overhead each, added one
        step at a time as :meth:`model_step` would (the same float sum, so metrics stay bit-equal);
        beyond EXACT_IDLE_STEPS at once, one multiplication (a gap no workload has, kept finite)."""
        overhead = self.profile.step_seconds(0, 0, 0, 0)
        if count > EXACT_IDLE_STEPS:
            self.record.modeled_seconds += count * overhead
            return
        modeled = self.record.modeled_seconds
        for _ in range(count):
            modeled += overhead
        self.record.modeled_seconds = modeled

    def model_step(self, scheduled: Sequence, plan: StepPlan) -> None:
        prefill = decode = total = 0  # one pass: this runs every step
        for item in scheduled:
            total += item.num_tokens
            if item.prefill:
                prefill += item.num_tokens
            else:
                decode += 1
        tpb = self.block_size
        loads = sum(len(job.gpu_block_ids) for job in plan.load_jobs) * tpb if plan.load_jobs else 0
        flushes = 0
        if plan.jobs_to_flush:
            flushed = (self.open_stores.get(job_id) for job_id in plan.jobs_to_flush)  # this plan's and older
            flushes = sum(len(store.job.gpu_block_ids) for store in flushed if store is not None) * tpb
        self.record.scheduled_tokens += total
        self.record.modeled_seconds += self.profile.step_seconds(prefill, decode, loads, flushes)

    # ---- invariants ---------------------------------------------------------------------------

    def invariant_failed(self, step: int, rule: str, error: AssertionError) -> None:
        """A failed invariant check is a result (the ``invariant_violations`` metric)."""
        self.record.invariant_failures.append(f"step {step}: {rule}: {error}")
        if len(self.record.invariant_violations) < FIRST_VIOLATIONS_KEPT:
            self.record.invariant_violations.append({"step": step, "rule": rule, "message": str(error)})
        self.record.invariant_violation_count += 1
