"""The metrics of a run: the glossary below is their one definition (JSON keys = chart labels).

Deterministic (the same command gives the same value): every metric but those whose definition
starts with "*measured*", which vary run to run on this machine. The glossary table of
docs/metrics.md is generated from ``GLOSSARY`` (``python scripts/readme_tables.py``; a test keeps them equal).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from kvoffload.engine.record import RunRecord


class Metric(NamedTuple):
    name: str  # key in the result JSON's "metrics"
    better: str  # "higher", "lower", "zero" (anything else is a bug) or "info"
    definition: str


MEASURED_MARK = "*measured*: "

# One row per metric, in table order. Add a metric here and in compute_metrics; nothing else.
GLOSSARY: tuple[Metric, ...] = (
    Metric("last_block_hit_rate", "higher", "of continuation requests (prompt extends a finished request's "
           "tokens) whose parent's last fully-written chunk was not in the GPU prefix cache at admission, "
           "the share the connector served. A fully-written chunk covers only positions below the parent's "
           "`num_tokens - 1` (below its computed tokens if it was aborted). `-` when no request was eligible"),
    Metric("last_block_eligible", "info", "number of such continuations"),
    Metric("last_chunk_offloaded_rate", "higher", "of finished requests with a fully-written chunk (as "
           "above; within the prompt when the connector offloads prompts only), the share whose last such chunk "
           "reached the offload tier: a successful store left that chunk's KV there (checked against the "
           "content oracle), before or after the request finished, by it or by a request with the same "
           "prefix. Whatever the GPU prefix cache holds; `-` when no request finished with a full chunk"),
    Metric("offload_hit_rate", "higher", "per admission (a request's first, and each one after a preemption, "
           "counted once however many lookups it took): tokens the connector supplied / tokens asked (the "
           "prompt beyond the GPU prefix hit)"),
    Metric("repeated_lookups", "info", "connector lookups that answered but did not end in an admission (the "
           "request could not get blocks and was looked up again)"),
    Metric("gpu_hit_rate", "higher", "GPU prefix-cache hit tokens / prompt tokens, first admissions"),
    Metric("poisoned_loads", "zero", "loaded chunks whose slots fail the KV content oracle"),
    Metric("lifecycle_violations", "zero", "manager calls out of lifecycle order for a request (strict mode)"),
    Metric("leaked_requests", "zero", "requests the connector still tracks after the run drained"),
    Metric("stuck_requests", "zero", "requests left waiting when nothing progressed for 200 steps, or "
           "alive when the progress watchdog or the max_steps cap stopped the run"),
    Metric("crashes", "zero", "1 if the connector died: it raised an exception of any type (the result's "
           "`error` keeps its type, message, the connector's own frames and the traceback), or could not be "
           "built or registered (`could not start`); the run stops there"),
    Metric("livelock", "zero", "1 if the progress watchdog stopped the run: no request finished and no "
           "position was computed past its earlier high-water mark for the watchdog window (docs/engine.md); "
           "the result's `diagnostics.livelock` names the cycle"),
    Metric("invariant_violations", "zero", "failed invariant checks of the block pool and the connector; "
           "the result's `diagnostics.invariant_violations` lists the first five with step and rule"),
    Metric("fence_violations", "zero", "GPU blocks written for another request while a store that reads "
           "them had not copied yet"),
    Metric("store_submit_delay_steps_p50", "lower", "steps from a chunk's KV being fully written to its "
           "store's submission, median. A chunk the request did not write in the blocks it holds (a GPU "
           "prefix-cache hit, or its own blocks handed back at a re-admission after preemption) counts "
           "from the step that planned its store"),
    Metric("store_submit_delay_steps_p99", "lower", "the same, 99th percentile"),
    Metric("store_visible_delay_steps_p50", "lower", "steps from fully written to `complete_store` "
           "(loadable), median"),
    Metric("store_visible_delay_steps_p99", "lower", "the same, 99th percentile"),
    Metric("connector_us_per_step", "lower", MEASURED_MARK + "wall time in connector calls per step, both sides"),
    Metric("tokens_per_s_modeled", "higher", "output tokens / modelled seconds (cost model, hardware profile)"),
    Metric("copy_gb_per_s", "higher", MEASURED_MARK + "bytes moved by the worker / seconds of copy time"),
    Metric("sim_requests_per_s", "higher", MEASURED_MARK + "requests replayed per second of simulator wall time"),
    Metric("output_tokens_per_s", "higher", MEASURED_MARK + "real model (`--engine vllm`): output tokens / "
           "wall seconds of the replay (engine start-up excluded)"),
    Metric("total_tokens_per_s", "higher", MEASURED_MARK + "real model: (prompt + output tokens) / the same "
           "wall seconds"),
    Metric("ttft_ms_p50", "lower", MEASURED_MARK + "real model: time to first token, from handing the request "
           "to the engine (before the iteration its arrival maps to) to the end of the iteration that returned "
           "its first token, median over requests with a first token, ms"),
    Metric("ttft_ms_p99", "lower", MEASURED_MARK + "real model: the same, 99th percentile"),
    Metric("tpot_ms_p50", "lower", MEASURED_MARK + "real model: time per output token after the first, "
           "(last token's time - first token's time) / (output tokens - 1), median over requests that "
           "finished with 2 or more tokens, ms"),
    Metric("tpot_ms_p99", "lower", MEASURED_MARK + "real model: the same, 99th percentile"),
    Metric("prefill_tokens_computed", "lower", MEASURED_MARK + "real model: prompt tokens the model computed, "
           "each request's prompt minus vLLM's `num_cached_tokens` (GPU prefix cache and connector) at its "
           "first schedule"),
    Metric("prefill_tokens_saved", "higher", MEASURED_MARK + "real model: prompt tokens the connector loaded "
           "instead of computing, every admission"),
    Metric("output_mismatches", "zero", MEASURED_MARK + "real model: requests whose greedy tokens, or first-N "
           "log-probabilities beyond the tolerance, differ from the same request's in the run with prefix caching "
           "and offloading off (the output oracle; the result's `oracle` names the first); `-` when it did not run"),
    Metric("wall_seconds", "info", MEASURED_MARK + "real model: wall time of the replay, engine start-up excluded"),
    Metric("engine_start_seconds", "info", MEASURED_MARK + "real model: wall time to start vLLM's engine "
           "(model load, KV cache, connector)"),
    Metric("requests", "info", "requests replayed"),
    Metric("steps", "info", "engine steps"),
    Metric("prompt_tokens", "info", "prompt tokens"),
    Metric("output_tokens", "info", "output tokens sampled"),
    Metric("preemptions", "info", "recompute preemptions"),
)

METRIC_NAMES: tuple[str, ...] = tuple(metric.name for metric in GLOSSARY)
# Wall-clock metrics: they differ run to run; every other metric is deterministic.
MEASURED_METRICS = frozenset(m.name for m in GLOSSARY if m.definition.startswith(MEASURED_MARK))
# Observed only where a real model ran (RunRecord.model_run); absent from other engines' results.
MODEL_METRICS = frozenset(m.name for m in GLOSSARY if m.definition.startswith(MEASURED_MARK + "real model"))


DIRECTION: dict[str, str] = {m.name: m.better for m in GLOSSARY}
# Two values of a deterministic metric are the same within float noise only.
REL_TOLERANCE, ABS_TOLERANCE = 1e-9, 1e-12
VERDICTS = ("same", "better", "worse", "info")


def same_value(a: float | None, b: float | None) -> bool:
    """Equal within float noise; None (no value) equals only None."""
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)


def judge(name: str, before: float | None, after: float | None) -> str:
    """The verdict of a change of metric ``name`` from ``before`` to ``after``, read from the
    glossary's direction: "same", "better", "worse", or "info" (an "info" metric, a metric the
    glossary does not know, or a value that appeared or disappeared: no direction to read).
    A "zero" metric is better the closer it is to 0."""
    if same_value(before, after):
        return "same"
    direction = DIRECTION.get(name, "info")
    if before is None or after is None or direction == "info":
        return "info"
    if direction == "zero":
        return "better" if abs(after) < abs(before) else "worse"
    return "better" if (after > before) == (direction == "higher") else "worse"


def glossary_markdown() -> str:
    """The glossary table of docs/metrics.md, generated from GLOSSARY."""
    lines = ["| metric | better | definition |", "|---|---|---|"]
    lines += [f"| `{m.name}` | {m.better} | {m.definition} |" for m in GLOSSARY]
    return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (an observed value, no interpolation); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def compute_metrics(record: RunRecord) -> dict[str, float | int | None]:
    eligible = [c for c in record.continuations if c.eligible]
    copy_seconds = record.store_seconds + record.load_seconds
    values: dict[str, float | int | None] = {
        "last_block_hit_rate": _ratio(sum(c.served for c in eligible), len(eligible)),
        "last_block_eligible": len(eligible),
        "last_chunk_offloaded_rate": _ratio(record.final_chunks_offloaded, record.final_chunks),
        "offload_hit_rate": _ratio(record.admission_hit_tokens, record.admission_asked_tokens),
        "repeated_lookups": record.connector_lookups - record.admissions,
        "gpu_hit_rate": _ratio(record.gpu_hit_tokens, record.admitted_prompt_tokens),
        "poisoned_loads": len(record.poisoned),
        "lifecycle_violations": record.lifecycle_violations,
        "leaked_requests": len(record.leaked_requests),
        "stuck_requests": len(record.stuck_requests),
        "crashes": int(record.crash is not None),
        "livelock": int(record.livelock is not None),
        "invariant_violations": record.invariant_violation_count,
        "fence_violations": len(record.fence_violations),
        "store_submit_delay_steps_p50": percentile(record.store_submit_delays, 50),
        "store_submit_delay_steps_p99": percentile(record.store_submit_delays, 99),
        "store_visible_delay_steps_p50": percentile(record.store_visible_delays, 50),
        "store_visible_delay_steps_p99": percentile(record.store_visible_delays, 99),
        "connector_us_per_step": _ratio(record.connector_seconds * 1e6, record.steps),
        "tokens_per_s_modeled": _ratio(record.output_tokens, record.modeled_seconds),
        "copy_gb_per_s": _ratio((record.store_bytes + record.load_bytes) / 1e9, copy_seconds),
        "sim_requests_per_s": _ratio(record.requests, record.wall_seconds),
        "output_tokens_per_s": _ratio(record.output_tokens, record.wall_seconds),
        "total_tokens_per_s": _ratio(record.prompt_tokens + record.output_tokens, record.wall_seconds),
        "ttft_ms_p50": _ms(percentile(record.ttft_seconds, 50)),
        "ttft_ms_p99": _ms(percentile(record.ttft_seconds, 99)),
        "tpot_ms_p50": _ms(percentile(record.tpot_seconds, 50)),
        "tpot_ms_p99": _ms(percentile(record.tpot_seconds, 99)),
        "prefill_tokens_computed": record.prefill_tokens_computed,
        "prefill_tokens_saved": record.prefill_tokens_saved,
        "output_mismatches": None if record.oracle is None else len(record.oracle["mismatches"]),
        "wall_seconds": record.wall_seconds,
        "engine_start_seconds": record.engine_start_seconds,
        "requests": record.requests,
        "steps": record.steps,
        "prompt_tokens": record.prompt_tokens,
        "output_tokens": record.output_tokens,
        "preemptions": record.preemptions,
    }
    assert tuple(values) == METRIC_NAMES
    return values


def format_value(name: str, value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if name.endswith("_rate"):
        return f"{value:.3f}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"
