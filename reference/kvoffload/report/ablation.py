"""(a) The fix ablation per workload: the reference, each fix flag off in turn, each vLLM preset.

One panel per metric of ``ABLATION_METRICS`` that has something to show. A rate is drawn as each
run's difference from the reference, in percentage points, on an axis sized to the largest
difference: 0.970 against 0.996 is a bar of -2.6 points, not two bars of nearly equal height on a
0-1 axis. A count (every one of them must be 0) is drawn as it is, the warning colour where it is
not 0. A metric with no value in any run (n/a), a rate equal to the reference's in every run, or
a count 0 in every run gets no panel: the figure's subtitle and the caption name it once. Each
metric's direction (higher is better, must be 0) is the glossary's.

The width is bounded (``figures.MAX_FIGURE_WIDTH_PX``): two panels side by side while their bars
fit, one per row beyond that, and a workload with more runs than one row holds gets its runs
wrapped into several rows of bars per metric. More runs make the figure taller, never wider.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure

from kvoffload.metrics import DIRECTION, format_value
from kvoffload.report.figures import (
    DEFINITIONS,
    FIX_VALUE,
    Chart,
    ablation_set,
    by_workload,
    direction_text,
    footer,
    label_color,
    max_width_inches,
    number_or_none,
    passed_over,
    passed_over_note,
    run_provenance,
    run_table,
    save_chart,
    slug,
    tick_labels,
)
from kvoffload.report.sources import RunFile

# last_chunk_offloaded_rate beside last_block_hit_rate: a reference below 1.0 on the latter is
# vLLM's complete-chunk lookup rule, and the former (1.0) shows the connector stored every chunk.
# Then the counts each fix's bug shows as (docs/fixes.md, "Each fix moves a figure").
ABLATION_METRICS = ("last_block_hit_rate", "last_chunk_offloaded_rate", "offload_hit_rate", "poisoned_loads",
                    "lifecycle_violations", "crashes", "stuck_requests", "leaked_requests")
MIN_POINTS_AXIS = 0.5  # a rate panel's axis spans at least +-0.5 points: a 0.1-point move still shows
WARNING_COLOR = "#d62728"
BAR_PITCH_IN = 0.36  # one bar and its gap: room for its rotated value and tick label
PANEL_MARGIN_IN = 1.0  # a panel's y tick labels and padding
PANEL_HEIGHT_IN = 4.2
_NA_REASONS = {"last_block_hit_rate": "no continuation of a finished request here: last_block_eligible 0",
               "last_chunk_offloaded_rate": "no request finished with a fully-written chunk"}


def must_be_zero(metric: str) -> bool:
    return DIRECTION.get(metric) == "zero"


def bars_per_panel(columns: int) -> int:
    """How many bars one panel holds when ``columns`` panels share the figure's width."""
    return max(1, int((max_width_inches() / columns - PANEL_MARGIN_IN) // BAR_PITCH_IN))


def reference_of(runs: Sequence[RunFile]) -> RunFile | None:
    return next((run for run in runs if run.label == "reference"), None)


def points_from_reference(metric: str, run: RunFile, reference: RunFile | None) -> float | None:
    """``run``'s rate minus the reference's, in percentage points; None where either is n/a."""
    value = number_or_none(run.metrics.get(metric))
    base = None if reference is None else number_or_none(reference.metrics.get(metric))
    return None if value is None or base is None else 100.0 * (value - base)


def not_drawn(runs: Sequence[RunFile]) -> dict[str, str]:
    """{metric: why it has no panel}: n/a for every run, a rate equal to the reference's (as
    printed: three decimals) in every run that did not crash, or a must-be-0 metric 0 for every run."""
    skipped = {}
    reference = reference_of(runs)
    for metric in ABLATION_METRICS:
        values = [number_or_none(run.metrics.get(metric)) for run in runs]
        if all(value is None for value in values):
            reason = _NA_REASONS.get(metric)
            skipped[metric] = "n/a for every run" + (f" ({reason})" if reason else "")
        elif must_be_zero(metric) and all(value in (0, None) for value in values):
            skipped[metric] = "0 for every run"
        elif not must_be_zero(metric) and reference is not None and all(
                value is None or run.crashed or format_value(metric, value) == format_value(
                    metric, reference.metrics.get(metric)) for run, value in zip(runs, values)):
            skipped[metric] = (f"the reference's {format_value(metric, reference.metrics.get(metric))} in every "
                               "run that did not crash")
    return skipped


def not_drawn_sentence(skipped: dict[str, str]) -> str:
    """'Not drawn: a and b 0 for every run; c n/a for every run (why)', metrics of one reason together."""
    by_reason: dict[str, list[str]] = {}
    for metric, reason in skipped.items():
        by_reason.setdefault(reason, []).append(metric)
    return "; ".join(f"{' and '.join(metrics)} {reason}" for reason, metrics in by_reason.items())


def ablation_groups(chosen: Sequence[RunFile]) -> list[tuple[str, list[RunFile]]]:
    """The ablation's bar groups, in order: the reference, each fix off, the presets, others."""
    kinds = (("reference", lambda label: label == "reference"),
             ("reference, one fix off", lambda label: label.startswith("reference ")),
             ("vLLM presets", lambda label: label.startswith("vllm-")))
    groups = [(name, [run for run in chosen if test(run.label)]) for name, test in kinds]
    claimed = {id(run) for _, runs in groups for run in runs}
    groups.append(("other", [run for run in chosen if id(run) not in claimed]))
    return [(name, runs) for name, runs in groups if runs]


def ablation_colors(metric: str, runs: Sequence[RunFile]) -> list[str]:
    """Each run's bar colour: by kind (reference, fix off, preset), or the warning colour where a
    must-be-0 metric is not 0."""
    return [WARNING_COLOR if must_be_zero(metric) and number_or_none(run.metrics.get(metric)) not in (None, 0)
            else label_color(run.label) for run in runs]


def ablation_figure(workload: str, ordered: Sequence[RunFile]) -> tuple[Figure, dict[str, str]]:
    """The figure, and the metrics it leaves out with the reason of each."""
    skipped = not_drawn(ordered)
    metrics = [metric for metric in ABLATION_METRICS if metric not in skipped]
    columns = 2 if len(metrics) > 1 and len(ordered) <= bars_per_panel(2) else 1
    per_row = min(len(ordered), bars_per_panel(columns))
    run_rows = [ordered[i:i + per_row] for i in range(0, len(ordered), per_row)]
    panels = [(metric, runs) for metric in metrics for runs in run_rows]
    rows = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(max_width_inches(), PANEL_HEIGHT_IN * rows + 1.2), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel() if panels else []
    reference = reference_of(ordered)
    for ax, (metric, runs) in zip(axes, panels):
        _panel(ax, metric, runs, len(run_rows) > 1, reference)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fixes_off = sum(run.label.startswith("reference ") for run in ordered)
    presets = sum(run.label.startswith("vllm-") for run in ordered)
    title = (f"Fix ablation: {workload}: the reference, {fixes_off} fix flag(s) off in turn, "
             f"{presets} vLLM preset(s)")
    if skipped:  # said once here instead of an empty panel each
        title += "\n" + "\n".join(textwrap.wrap(f"Not drawn: {not_drawn_sentence(skipped)}.", 140))
    fig.suptitle(title, fontsize=11)
    footer(fig, ordered)
    if not panels:
        fig.set_figheight(1.6)
    fig.get_layout_engine().set(rect=(0, 0.03 if panels else 0.15, 1, 0.97 if panels else 0.85))
    return fig, skipped


def draw_ablation(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    """Per workload: the reference, each fix off in turn, each preset; one panel per metric."""
    charts = []
    for workload, group in by_workload(runs).items():
        chosen = ablation_set(group)
        ordered = [run for _, members in ablation_groups(chosen) for run in members]
        fig, skipped = ablation_figure(workload, ordered)
        filename = save_chart(fig, out, f"ablation-{slug(workload)}.png")
        duplicates = passed_over_note(passed_over(ordered, group))
        caption = ("Bars: green the reference (every fix), orange the reference with one fix flag off, blue a "
                   "vLLM release preset; hatched: the run crashed. Rates: each run's difference from the "
                   "reference in percentage points, its value in brackets (\"=\": the reference's; a crashed "
                   "run's rates cover only what ran, so it gets none). Counts: as they are, red where a "
                   "must-be-0 count is not 0. "
                   + (f"Not drawn: {not_drawn_sentence(skipped)}. " if skipped else "")
                   + (duplicates + " " if duplicates else "")
                   + "; ".join(f"{m} ({direction_text(m)}): {DEFINITIONS[m]}" for m in ABLATION_METRICS))
        charts.append(Chart(FIX_VALUE, f"fix ablation: {workload}", filename, caption, run_provenance(ordered),
                            table=run_table(ordered, ABLATION_METRICS)))
    return charts


def _panel(ax, metric: str, runs: Sequence[RunFile], continued: bool, reference: RunFile | None) -> None:
    if must_be_zero(metric) or reference is None:
        _count_panel(ax, metric, runs)
        heading = f"{metric} ({direction_text(metric)}"
    else:
        _difference_panel(ax, metric, runs, reference)
        base = format_value(metric, reference.metrics.get(metric))
        heading = f"{metric}: points from the reference's {base} ({direction_text(metric)}"
    part = f", {runs[0].label} to {runs[-1].label}" if continued else ""
    ax.set_title(heading + part + ")", fontsize=10, pad=14)
    ax.set_xticks(range(len(runs)), [label.removeprefix("reference\n") for label in tick_labels(runs)], rotation=40,
                  ha="right", fontsize=7)
    start = 0
    for name, members in ablation_groups(runs):  # group separators and names above the bars
        if start:
            ax.axvline(start - 0.5, color="#999999", linewidth=0.8)
        ax.annotate(name, ((start + start + len(members) - 1) / 2, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7,
                    color="#555555")
        start += len(members)
    ax.set_xlim(-0.6, len(runs) - 0.4)
    ax.grid(axis="y", alpha=0.3)


def _count_panel(ax, metric: str, runs: Sequence[RunFile]) -> None:
    values = [number_or_none(run.metrics.get(metric)) for run in runs]
    colors = ablation_colors(metric, runs)
    warn = [color == WARNING_COLOR for color in colors]
    bars = ax.bar(range(len(runs)), [0.0 if v is None else v for v in values], color=colors,
                  hatch=["//" if run.crashed else "" for run in runs], edgecolor="white")
    for bar, value, w in zip(bars, values, warn):
        text = "n/a" if value is None else (f"{value:.3f}" if metric.endswith("_rate") else f"{value:g}")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, 0.0 if value is None else value), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7 if not w else 8,
                    color=WARNING_COLOR if w else "black", fontweight="bold" if w else "normal", rotation=90)
    known = [v for v in values if v is not None]
    ax.set_ylim(0, (1.25 if metric.endswith("_rate") else max(1.0, max(known + [0.0]) * 1.3)))


def _difference_panel(ax, metric: str, runs: Sequence[RunFile], reference: RunFile) -> None:
    """Bars of each run's difference from the reference (points), each labelled with its value. A
    crashed run's rates cover only what ran before the crash: it gets no bar, only "crashed"."""
    points = [None if run.crashed else points_from_reference(metric, run, reference) for run in runs]
    bars = ax.bar(range(len(runs)), [0.0 if p is None else p for p in points],
                  color=[label_color(run.label) for run in runs],
                  hatch=["//" if run.crashed else "" for run in runs], edgecolor="white")
    span = max([abs(p) for p in points if p is not None] + [MIN_POINTS_AXIS / 1.4]) * 1.4
    for bar, run, p in zip(bars, runs, points):
        value = number_or_none(run.metrics.get(metric))
        if run.crashed:
            text = "crashed"
        else:
            text = "n/a" if p is None else ("=" if round(p, 1) == 0 else f"{p:+.1f}") + f" ({value:.3f})"
        up = p is None or p >= 0
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, 0.0 if p is None else p), xytext=(0, 2 if up else -2),
                    textcoords="offset points", ha="center", va="bottom" if up else "top", fontsize=7, rotation=90)
    ax.axhline(0, color="#333333", linewidth=0.8)
    ax.set_ylim(-span * 1.6, span * 1.6)  # room for the rotated labels on either side
    ax.set_ylabel("percentage points", fontsize=8)


__all__ = ["ABLATION_METRICS", "WARNING_COLOR", "ablation_colors", "ablation_figure",
           "ablation_groups", "draw_ablation", "not_drawn"]
