"""(a) The fix ablation per workload: the reference, each fix flag off in turn, each vLLM preset.

One panel per metric of ``ABLATION_METRICS`` that has something to show. A metric with no value
in any run (n/a), or a must-be-0 metric that is 0 in every run, gets no empty panel: the figure's
subtitle and the caption list it once. A must-be-0 count that is not 0 is drawn in the warning
colour. Each metric's direction (higher is better, must be 0) is the glossary's.

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

from kvoffload.metrics import DIRECTION
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
ABLATION_METRICS = ("last_block_hit_rate", "last_chunk_offloaded_rate", "offload_hit_rate", "poisoned_loads",
                    "lifecycle_violations")
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


def not_drawn(runs: Sequence[RunFile]) -> dict[str, str]:
    """{metric: why it has no panel}: n/a for every run, or a must-be-0 metric 0 for every run."""
    skipped = {}
    for metric in ABLATION_METRICS:
        values = [number_or_none(run.metrics.get(metric)) for run in runs]
        if all(value is None for value in values):
            reason = _NA_REASONS.get(metric)
            skipped[metric] = "n/a for every run" + (f" ({reason})" if reason else "")
        elif must_be_zero(metric) and all(value == 0 for value in values):
            skipped[metric] = "0 for every run"
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
    for ax, (metric, runs) in zip(axes, panels):
        _panel(ax, metric, runs, continued=len(run_rows) > 1)
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
                   "vLLM release preset; red: a must-be-0 count that is not 0. "
                   + (f"Not drawn: {not_drawn_sentence(skipped)}. " if skipped else "")
                   + (duplicates + " " if duplicates else "")
                   + "; ".join(f"{m} ({direction_text(m)}): {DEFINITIONS[m]}" for m in ABLATION_METRICS))
        charts.append(Chart(FIX_VALUE, f"fix ablation: {workload}", filename, caption, run_provenance(ordered),
                            table=run_table(ordered, ABLATION_METRICS)))
    return charts


def _panel(ax, metric: str, runs: Sequence[RunFile], continued: bool) -> None:
    values = [number_or_none(run.metrics.get(metric)) for run in runs]
    colors = ablation_colors(metric, runs)
    warn = [color == WARNING_COLOR for color in colors]
    x = list(range(len(runs)))
    bars = ax.bar(x, [0.0 if v is None else v for v in values], color=colors,
                  hatch=["//" if run.crashed else "" for run in runs], edgecolor="white")
    for bar, value, w in zip(bars, values, warn):
        text = "n/a" if value is None else (f"{value:.3f}" if metric.endswith("_rate") else f"{value:g}")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, 0.0 if value is None else value), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7 if not w else 8,
                    color=WARNING_COLOR if w else "black", fontweight="bold" if w else "normal", rotation=90)
    part = f", {runs[0].label} to {runs[-1].label}" if continued else ""
    ax.set_title(f"{metric} ({direction_text(metric)}{part})", fontsize=10, pad=14)
    ax.set_xticks(x, [label.removeprefix("reference\n") for label in tick_labels(runs)], rotation=40,
                  ha="right", fontsize=7)
    known = [v for v in values if v is not None]
    if metric.endswith("_rate"):
        ax.set_ylim(0, 1.25)  # room above 1.0 for the rotated values
    else:
        ax.set_ylim(0, max(1.0, max(known + [0.0]) * 1.3))
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


__all__ = ["ABLATION_METRICS", "WARNING_COLOR", "ablation_colors", "ablation_figure",
           "ablation_groups", "draw_ablation", "not_drawn"]
