"""What a run found, in lines under ``run``'s and ``bench``'s tables: the crash with the
connector's own frames (or "could not start"), the poisoned loads as request, step, chunk and
bad slots, and a connector that served nothing where the reference serves some. Read from the
result file, so a table and the file it came from say the same thing."""

from __future__ import annotations

from kvoffload.metrics import GLOSSARY

ZERO_METRICS = tuple(metric.name for metric in GLOSSARY if metric.better == "zero")
FRAMES_SHOWN = 4  # the connector's innermost frames a table shows (the result file keeps more)


def finding_lines(result: dict, indent: str = "") -> list[str]:
    lines = []
    error = result.get("error") or {}
    if error.get("type"):
        where = "" if error.get("step") is None else f" at step {error['step']}"
        lines.append(f"crash{where}: {error['message']}")
        lines += [f"  {frame}" for frame in error.get("connector_frames", [])[-FRAMES_SHOWN:]]
    poisoned = result.get("poisoned_loads")
    if poisoned:
        lines.append(f"poisoned loads: {poisoned['count']} (request, step, chunk, bad slots)")
        lines += [f"  {p['req_id']} step {p['step']} chunk {p['chunk']}: {p['bad_slots']} bad slot"
                  f"{'s' * (p['bad_slots'] != 1)}" for p in poisoned["first"]]
        if poisoned["count"] > len(poisoned["first"]):
            lines.append(f"  ... and {poisoned['count'] - len(poisoned['first'])} more")
    served = result.get("served_nothing")
    if served:
        lines.append(f"served nothing: {served['message']}")
    return [indent + line for line in lines]


def strict_failures(result: dict) -> list[str]:
    """``--strict``: every zero-metric above 0, and a connector that served nothing."""
    metrics = result["metrics"]
    failures = [f"{name}={metrics[name]}" for name in ZERO_METRICS if metrics.get(name)]
    if result.get("served_nothing"):
        failures.append("served nothing")
    return failures
