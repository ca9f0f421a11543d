"""What a run observed, raw: the metrics module turns this into the glossary's numbers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoisonedLoad:
    step: int
    req_id: str
    chunk: int
    bad_slots: int
    group: int = 0  # the KV cache group of the chunk (core/model.py)

    def describe(self) -> str:
        return f"{self.req_id} step {self.step} chunk {self.chunk} ({self.bad_slots} bad slot{'s' * (self.bad_slots != 1)})"


POISONED_LISTED = 10  # poisoned loads a result file and a table list one by one (then the count)


def describe_poisoned(poisoned: list[PoisonedLoad], limit: int = POISONED_LISTED) -> str:
    """The first ``limit`` poisoned loads as request, step, chunk and bad slots, and how many."""
    listed = "; ".join(p.describe() for p in poisoned[:limit])
    more = f"; and {len(poisoned) - limit} more" if len(poisoned) > limit else ""
    return f"{len(poisoned)} poisoned load{'s' * (len(poisoned) != 1)}: {listed}{more}"


@dataclass(frozen=True)
class FenceViolation:
    step: int
    block: int
    writer: str  # "forward" or "load"


@dataclass(frozen=True)
class Continuation:
    """A follow-up's first admission, seen against its parent's last fully-written chunk."""

    req_id: str
    parent: str
    eligible: bool  # the parent's last fully-written chunk was not in the GPU prefix cache
    served: bool  # ... and the connector supplied it


def last_written_chunk_end(num_tokens: int, num_computed_tokens: int, aborted: bool, tokens_per_chunk: int) -> int:
    """End of a finished parent's last fully-written chunk (the glossary's last_block_hit_rate):
    a forward pass wrote every position but the final sampled token's; an aborted request only
    got as far as it was computed."""
    written = num_tokens - 1
    if aborted:
        written = min(written, num_computed_tokens)
    return (written // tokens_per_chunk) * tokens_per_chunk


def continuation(req_id: str, parent_id: str, prompt: tuple[int, ...], parent_truth: tuple[int, ...],
                 last_chunk_end: int, num_local: int, hits: int) -> Continuation | None:
    """A follow-up's first admission against its parent, or None when its prompt does not extend
    the parent's last fully-written chunk (both engines count continuations with this)."""
    if last_chunk_end == 0 or parent_truth[:last_chunk_end] != prompt[:last_chunk_end]:
        return None
    eligible = num_local < last_chunk_end
    return Continuation(req_id, parent_id, eligible, eligible and num_local + hits >= last_chunk_end)


@dataclass
class RunRecord:
    steps: int = 0
    requests: int = 0
    finished_requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    scheduled_tokens: int = 0
    gpu_hit_tokens: int = 0  # first admissions only
    admitted_prompt_tokens: int = 0
    connector_hit_tokens_admitted: int = 0
    # Every answered get_num_new_matched_tokens call (re-admissions and repeats included) and
    # the tokens it asked about (the prompt beyond the GPU prefix hit); deferred calls excluded.
    connector_lookups: int = 0
    connector_lookup_tokens: int = 0
    # Every admission from the waiting queue through a lookup (first or after a preemption), once
    # each however many lookups it took: tokens asked (beyond the GPU prefix hit), tokens supplied.
    admissions: int = 0
    admission_asked_tokens: int = 0
    admission_hit_tokens: int = 0
    preemptions: int = 0
    # Scripted cache resets: (step, accepted). Refused (False) while GPU blocks are in use; the
    # connector's cache is reset either way (docs/engine.md, "Resetting the caches").
    resets: list[tuple[int, bool]] = field(default_factory=list)
    poisoned: list[PoisonedLoad] = field(default_factory=list)
    fence_violations: list[FenceViolation] = field(default_factory=list)
    continuations: list[Continuation] = field(default_factory=list)
    # Finished requests with a fully-written chunk (within the prompt under offload_prompt_only),
    # and those whose last such chunk reached the offload tier (engine/final_chunks.py).
    final_chunks: int = 0
    final_chunks_offloaded: int = 0
    store_submit_delays: list[int] = field(default_factory=list)  # per chunk, in steps
    store_visible_delays: list[int] = field(default_factory=list)
    connector_seconds: float = 0.0  # wall time inside connector calls, both sides
    modeled_seconds: float = 0.0
    wall_seconds: float = 0.0
    crash: str | None = None  # "Type: message" (engine/crashes.py), "could not start: ..." before the run
    crash_step: int | None = None
    crash_type: str | None = None
    crash_frames: list[str] = field(default_factory=list)  # the connector's own frames, innermost last
    crash_traceback: str | None = None
    start_failed: bool = False  # the connector failed while being built or registered
    stuck_requests: tuple[str, ...] = ()
    stuck_message: str | None = None  # why nothing was scheduled for them (the run's error)
    leaked_requests: tuple[str, ...] = ()
    lifecycle_violations: int = 0
    invariant_failures: list[str] = field(default_factory=list)  # "step N: rule: message", all of them
    invariant_violation_count: int = 0
    invariant_violations: list[dict] = field(default_factory=list)  # the first few: step, rule, message
    livelock: dict | None = None  # the progress watchdog's verdict (engine/watchdog.py)
    livelock_message: str | None = None
    max_steps_reached: bool = False  # the run stopped at the max_steps cap
    store_bytes: int = 0
    store_seconds: float = 0.0
    load_bytes: int = 0
    load_seconds: float = 0.0
    unknown_wait_ids: int = 0
    connector_stats: dict = field(default_factory=dict)
    # A real model's run (the vllm engine, kvoffload.vllm.llm_engine): measured, not modelled.
    model_run: bool = False
    ttft_seconds: list[float] = field(default_factory=list)  # per request with a first token
    tpot_seconds: list[float] = field(default_factory=list)  # per finished request with 2+ tokens
    prefill_tokens_computed: int = 0
    prefill_tokens_saved: int = 0
    engine_start_seconds: float | None = None
    oracle: dict | None = None  # the output oracle's report (kvoffload.vllm.outputs), when it ran
    engine_settings: dict | None = None  # what the real engine ran (geometry, dtype, scheduling)
    trace_events: list[dict] = field(default_factory=list)

    def problems(self, *, fences: bool = False, lifecycle: bool = False, invariants: bool = False) -> list[str]:
        """What went wrong, one phrase each, naming what was seen: the crash (with the connector's
        innermost frame), each poisoned load, the stuck and the leaked request ids; ``fences``,
        ``lifecycle``, ``invariants`` add what only the simulator can see. Empty: clean."""
        found = []
        if self.crash is not None:
            where = "" if self.crash_step is None else f" at step {self.crash_step}"
            frame = f" [{self.crash_frames[-1]}]" if self.crash_frames else ""
            found.append(f"crash{where}: {self.crash}{frame}")
        if self.poisoned:
            found.append(describe_poisoned(self.poisoned))
        if fences and self.fence_violations:
            found.append(f"{len(self.fence_violations)} fence violations: " + "; ".join(
                f"block {v.block} written by the {v.writer} at step {v.step}" for v in self.fence_violations[:5]))
        if self.stuck_requests:
            found.append(f"stuck: {', '.join(self.stuck_requests)}" + (f" ({self.stuck_message})" if self.stuck_message
                                                                        else ""))
        if self.leaked_requests:
            found.append(f"leaked (still tracked after the run): {', '.join(self.leaked_requests)}")
        if lifecycle and self.lifecycle_violations:
            found.append(f"{self.lifecycle_violations} lifecycle violations")
        if invariants and self.invariant_failures:
            found.append(f"invariants failed: {'; '.join(self.invariant_failures[:3])}")
        return found
