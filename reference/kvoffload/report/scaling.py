"""Cost against trace size: wall time and peak memory of replays of growing prefixes of a trace.

``draw_scaling`` takes measured points (``scripts/measure_scaling.py`` writes them) and draws
both quantities per request count on log-log axes, with a line of slope 1 through the smallest
point of each series: a series that stays on or under its line grows linearly or better.
Drawn with matplotlib's object API (no pyplot), like the other report figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure

from kvoffload.report.figures import save_figure


@dataclass(frozen=True)
class ScalingPoint:
    series: str  # e.g. "conversation sync"
    requests: int
    wall_seconds: float
    peak_rss_bytes: int
    cpu_seconds: float | None = None  # the replay's own CPU time: on a shared machine, the idle wall time


def draw_scaling(points: Sequence[ScalingPoint], out: Path, title: str = "Replay cost against trace size") -> Path:
    """One PNG: wall time (left) and peak RSS (right) against requests, per series."""
    if not points:
        raise ValueError("no scaling points to draw")
    figure = Figure(figsize=(12, 4.4), layout="constrained")
    time_axes, memory_axes = figure.subplots(1, 2)
    series = sorted({point.series for point in points})
    for name in series:
        mine = sorted((p for p in points if p.series == name), key=lambda p: p.requests)
        requests = [p.requests for p in mine]
        for axes, values in ((time_axes, [p.wall_seconds for p in mine]),
                             (memory_axes, [p.peak_rss_bytes / 2**30 for p in mine])):
            line, = axes.plot(requests, values, marker="o", label=name)
            linear = [values[0] * r / requests[0] for r in requests]
            axes.plot(requests, linear, linestyle=":", color=line.get_color(), alpha=0.6)
        if all(p.cpu_seconds is not None for p in mine):
            time_axes.plot(requests, [p.cpu_seconds for p in mine], marker="x", linestyle="--",
                           color=line.get_color(), label=f"{name} (CPU s)")
    for axes, label in ((time_axes, "wall time (s)"), (memory_axes, "peak RSS (GiB)")):
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("requests replayed (first N of the trace)")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)
    handles, labels = time_axes.get_legend_handles_labels()  # beside the panels, never over a point
    figure.legend(handles, labels, loc="outside right upper", fontsize="small")
    figure.suptitle(f"{title}\n(dotted: linear growth from the smallest point; dashed: CPU seconds)",
                    fontsize="medium")
    save_figure(figure, out)
    return out
