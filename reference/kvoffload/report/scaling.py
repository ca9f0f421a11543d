"""Cost against trace size: peak memory of replays of growing prefixes of a trace.

``draw_scaling`` takes measured points (``scripts/measure_scaling.py`` writes them) and draws the
peak RSS per request count on log-log axes, with a line of slope 1 through the smallest point of
each series: a series that stays on or under its line grows linearly or better. The replay's
memory follows what it holds, not the machine's load; its wall and CPU seconds do, and each point
is one replay (no spread), so the times are not drawn: the chart's title says so and
``scaling.json`` keeps them, with the load of each. Drawn with matplotlib's object API (no
pyplot), like the other report figures.
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


def draw_scaling(points: Sequence[ScalingPoint], out: Path, title: str = "Replay memory against trace size") -> Path:
    """One PNG: peak RSS against requests, per series."""
    if not points:
        raise ValueError("no scaling points to draw")
    figure = Figure(figsize=(9, 4.6), layout="constrained")
    memory_axes = figure.subplots(1, 1)
    for name in sorted({point.series for point in points}):
        mine = sorted((p for p in points if p.series == name), key=lambda p: p.requests)
        requests = [p.requests for p in mine]
        values = [p.peak_rss_bytes / 2**30 for p in mine]
        line, = memory_axes.plot(requests, values, marker="o", label=name)
        memory_axes.plot(requests, [values[0] * r / requests[0] for r in requests], linestyle=":",
                         color=line.get_color(), alpha=0.6)
    memory_axes.set_xscale("log")
    memory_axes.set_yscale("log")
    memory_axes.set_xlabel("requests replayed (first N of the trace)")
    memory_axes.set_ylabel("peak RSS (GiB)")
    memory_axes.grid(True, which="both", alpha=0.3)
    handles, labels = memory_axes.get_legend_handles_labels()  # beside the panel, never over a point
    figure.legend(handles, labels, loc="outside right upper", fontsize="small")
    figure.suptitle(f"{title}\n(dotted: linear growth from the smallest point; wall and CPU seconds are one "
                    "replay each at the load scaling.json records: not drawn)", fontsize="medium")
    save_figure(figure, out)
    return out
