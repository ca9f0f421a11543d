"""The metrics of a run, named exactly as DESIGN.md's glossary (JSON keys = chart labels).

Deterministic (the same command gives the same value): every count, hit rate, delay and
``tokens_per_s_modeled``. Measured on this machine (vary run to run): ``connector_us_per_step``,
``copy_gb_per_s``, ``sim_requests_per_s``.
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.engine.record import RunRecord

# (key, direction for readers, one-line definition) in table order.
GLOSSARY: tuple[tuple[str, str, str], ...] = (
    ("last_block_hit_rate", "higher", "continuations whose parent's last fully-written chunk (below "
     "num_tokens - 1) was not in the GPU prefix cache at admission: share the connector served"),
    ("last_block_eligible", "info", "number of such continuations"),
    ("offload_hit_rate", "higher", "per admission (first or after a preemption, each once): tokens the "
     "connector supplied / tokens asked (prompt beyond the GPU prefix hit)"),
    ("repeated_lookups", "info", "connector lookups answered without an admission (the request was "
     "looked up again later)"),
    ("gpu_hit_rate", "higher", "GPU prefix-cache hit tokens / prompt tokens (first admissions)"),
    ("poisoned_loads", "zero", "loaded chunks that fail the KV content oracle"),
    ("lifecycle_violations", "zero", "manager calls out of lifecycle order (strict mode)"),
    ("leaked_requests", "zero", "requests the connector still tracks after the drain"),
    ("stuck_requests", "zero", "requests never scheduled again (no progress for 200 steps)"),
    ("crashes", "zero", "1 if the connector died (assert, KeyError); the run stops there"),
    ("fence_violations", "zero", "GPU blocks written for another request before a pending store copied them"),
    ("store_submit_delay_steps_p50", "lower", "steps from a chunk's KV fully written to its store's submission"),
    ("store_submit_delay_steps_p99", "lower", ""),
    ("store_visible_delay_steps_p50", "lower", "steps from fully written to complete_store (loadable)"),
    ("store_visible_delay_steps_p99", "lower", ""),
    ("connector_us_per_step", "lower", "wall time in connector calls per step, both sides (measured)"),
    ("tokens_per_s_modeled", "higher", "output tokens / modelled seconds (cost model, hardware profile)"),
    ("copy_gb_per_s", "higher", "bytes moved by the worker / seconds of copy time (measured)"),
    ("sim_requests_per_s", "higher", "requests replayed per second of simulator wall time (measured)"),
    ("requests", "info", "requests replayed"),
    ("steps", "info", "engine steps"),
    ("prompt_tokens", "info", "prompt tokens"),
    ("output_tokens", "info", "output tokens sampled"),
    ("preemptions", "info", "recompute preemptions"),
)

METRIC_NAMES: tuple[str, ...] = tuple(name for name, _, _ in GLOSSARY)
MEASURED = frozenset({"connector_us_per_step", "copy_gb_per_s", "sim_requests_per_s"})


def percentile(values: Sequence[int], q: float) -> int | None:
    """Nearest-rank percentile (an observed value, no interpolation); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def compute_metrics(record: RunRecord) -> dict[str, float | int | None]:
    eligible = [c for c in record.continuations if c.eligible]
    copy_seconds = record.store_seconds + record.load_seconds
    values: dict[str, float | int | None] = {
        "last_block_hit_rate": _ratio(sum(c.served for c in eligible), len(eligible)),
        "last_block_eligible": len(eligible),
        "offload_hit_rate": _ratio(record.admission_hit_tokens, record.admission_asked_tokens),
        "repeated_lookups": record.connector_lookups - record.admissions,
        "gpu_hit_rate": _ratio(record.gpu_hit_tokens, record.admitted_prompt_tokens),
        "poisoned_loads": len(record.poisoned),
        "lifecycle_violations": record.lifecycle_violations,
        "leaked_requests": len(record.leaked_requests),
        "stuck_requests": len(record.stuck_requests),
        "crashes": int(record.crash is not None),
        "fence_violations": len(record.fence_violations),
        "store_submit_delay_steps_p50": percentile(record.store_submit_delays, 50),
        "store_submit_delay_steps_p99": percentile(record.store_submit_delays, 99),
        "store_visible_delay_steps_p50": percentile(record.store_visible_delays, 50),
        "store_visible_delay_steps_p99": percentile(record.store_visible_delays, 99),
        "connector_us_per_step": _ratio(record.connector_seconds * 1e6, record.steps),
        "tokens_per_s_modeled": _ratio(record.output_tokens, record.modeled_seconds),
        "copy_gb_per_s": _ratio((record.store_bytes + record.load_bytes) / 1e9, copy_seconds),
        "sim_requests_per_s": _ratio(record.requests, record.wall_seconds),
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
