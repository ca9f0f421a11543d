"""(c) store delays per workload: each run's whole delay distribution, in small multiples.

Delays are whole engine steps and take few values, so each distribution is drawn as bars (the
share of stored chunks at each delay). Each run has its own row of panels (submission, visibility),
every row on the same x and y axes: a distribution of one value is one full bar, two runs with the
same distribution are two equal rows instead of one line hiding the other, and more runs or a
wider delay span make the figure taller, never wider (``figures.MAX_FIGURE_WIDTH_PX``). Where a
run's file keeps only the percentiles, its p50 and p99 are drawn instead, the runs wrapped into
rows of at most ``PERCENTILE_RUNS_PER_ROW`` pairs of bars.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kvoffload.report.figures import (
    DEFINITIONS,
    RELEASE_LOSS,
    Chart,
    ablation_set,
    by_workload,
    distinct_colors,
    footer,
    label_color,
    label_order,
    max_width_inches,
    number_or_none,
    passed_over,
    passed_over_note,
    run_provenance,
    save_chart,
    slug,
    tick_labels,
)
from kvoffload.report.sources import RunFile

DELAY_METRICS = ("store_submit_delay_steps", "store_visible_delay_steps")
DELAY_PANEL_WIDTH_IN = 5.2  # one distribution panel; two side by side, the run's name to their left
DELAY_ROW_HEIGHT_IN = 1.15
PERCENTILE_RUNS_PER_ROW = 8


def draw_store_delays(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    """Per workload: the full delay distributions where every run keeps them, else the p50/p99 bars."""
    charts = []
    for workload, group in by_workload(runs).items():
        chosen = sorted(ablation_set(group), key=lambda run: label_order([r.label for r in group]).index(run.label))
        full = all(metric in run.distributions for run in chosen for metric in DELAY_METRICS)
        fig = _delay_distributions(chosen) if full else _delay_percentiles(chosen)
        fig.suptitle(f"Store delays: {workload}", fontsize=12)
        footer(fig, chosen)
        footer_in = 0.3 / fig.get_figheight()  # the footer's line, whatever the figure's height
        fig.get_layout_engine().set(rect=(0, footer_in, 1, 1 - footer_in))
        filename = save_chart(fig, out, f"store-delays-{slug(workload)}.png")
        kept = ("the whole distribution of each run: the share of its stored chunks at each delay, one row per "
                "run, every row on the same axes" if full
                else "p50 and p99 of each run (these result files keep the percentiles only)")
        duplicates = passed_over_note(passed_over(chosen, group))
        charts.append(Chart(RELEASE_LOSS, f"store delays: {workload}", filename,
                            f"{kept}. {duplicates + ' ' if duplicates else ''}"
                            f"store_submit_delay_steps: {DEFINITIONS['store_submit_delay_steps_p50']}; "
                            f"store_visible_delay_steps: {DEFINITIONS['store_visible_delay_steps_p50']}",
                            run_provenance(chosen), table=delay_table(chosen)))
    return charts


def delay_table(chosen: Sequence[RunFile]) -> tuple[tuple[str, ...], ...]:
    """One row per run, metric and delay: the chunks stored with that delay (the chart's data)."""
    header = ("workload", "connector", "metric", "delay_steps", "chunks", "share", "result file")
    rows = []
    for run in chosen:
        for metric in DELAY_METRICS:
            counts = run.distributions.get(metric, {})
            total = sum(counts.values())
            rows += [(run.workload, run.label, metric, str(steps), str(n), f"{n / total:.6f}", str(run.path))
                     for steps, n in sorted(counts.items())]
    return (header, *rows)


def _delay_distributions(chosen: Sequence[RunFile]) -> Figure:
    """One row per run, one column per metric; shared axes, so rows compare at a glance."""
    delays = sorted({steps for run in chosen for metric in DELAY_METRICS for steps in run.distributions[metric]})
    fig = Figure(figsize=(2 * DELAY_PANEL_WIDTH_IN + 1.6, DELAY_ROW_HEIGHT_IN * len(chosen) + 1.3),
                 layout="constrained")
    axes = fig.subplots(len(chosen), len(DELAY_METRICS), sharex="col", sharey=True, squeeze=False)
    colors = distinct_colors([run.label for run in chosen])
    label_values = len(delays) <= 12  # few bars: each one's share is written on it
    for row, run in zip(axes, chosen):
        for ax, metric in zip(row, DELAY_METRICS):
            counts = run.distributions[metric]
            total = sum(counts.values())
            steps = sorted(counts)
            shares = [counts[s] / total if total else 0.0 for s in steps]
            bars = ax.bar(steps, shares, 0.8, color=colors[run.label], edgecolor="white", linewidth=0.5)
            if label_values:
                for bar, share in zip(bars, shares):
                    text = "<0.01" if 0 < share < 0.005 else f"{share:.2f}"  # a few chunks are not none
                    ax.annotate(text, (bar.get_x() + bar.get_width() / 2, share), xytext=(0, 1),
                                textcoords="offset points", ha="center", va="bottom", fontsize=7)
            ax.set_ylim(0, 1.3)
            ax.set_yticks([0, 0.5, 1.0])
            ax.tick_params(labelsize=7)
            ax.grid(axis="y", alpha=0.3)
        row[0].set_ylabel(f"{run.label}\n({sum(run.distributions[DELAY_METRICS[0]].values())} chunks)",
                          fontsize=7, rotation=0, ha="right", va="center")
    for ax, metric in zip(axes[0], DELAY_METRICS):
        ax.set_title(f"{metric}: share of stored chunks\n(more on the left is better)", fontsize=10)
    for ax, metric in zip(axes[-1], DELAY_METRICS):
        shown = sorted({s for run in chosen for s in run.distributions[metric]})
        if shown and shown[-1] - shown[0] <= 30:  # delays are whole steps: one tick each
            ax.set_xticks(range(shown[0], shown[-1] + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if shown:
            ax.set_xlim(shown[0] - 0.6, shown[-1] + 0.6)
        ax.set_xlabel("delay (engine steps)", fontsize=9)
    return fig


def _delay_percentiles(chosen: Sequence[RunFile]) -> Figure:
    """p50 and p99 bars per run; one panel per metric and row of at most PERCENTILE_RUNS_PER_ROW runs."""
    run_rows = [chosen[i:i + PERCENTILE_RUNS_PER_ROW] for i in range(0, len(chosen), PERCENTILE_RUNS_PER_ROW)]
    fig = Figure(figsize=(max_width_inches(), 3.8 * len(run_rows) + 0.8), layout="constrained")
    axes = fig.subplots(len(run_rows), len(DELAY_METRICS), squeeze=False)
    width = 0.38
    # every row of a metric on one y scale: the highest p99 of all runs
    tops = {metric: max([number_or_none(run.metrics.get(f"{metric}_p99")) or 0.0 for run in chosen] + [1.0])
            for metric in DELAY_METRICS}
    for row_axes, runs in zip(axes, run_rows):
        for ax, metric in zip(row_axes, DELAY_METRICS):
            x = list(range(len(runs)))
            for offset, (pct, alpha) in zip((-width / 2, width / 2), (("p50", 1.0), ("p99", 0.45))):
                values = [number_or_none(run.metrics.get(f"{metric}_{pct}")) for run in runs]
                bars = ax.bar([i + offset for i in x], [0.0 if v is None else v for v in values], width,
                              color=[label_color(run.label) for run in runs], alpha=alpha, label=pct)
                for bar, value in zip(bars, values):
                    ax.annotate("n/a" if value is None else f"{value:g}",
                                (bar.get_x() + bar.get_width() / 2, 0.0 if value is None else value), xytext=(0, 2),
                                textcoords="offset points", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(x, tick_labels(runs), rotation=30, ha="right", fontsize=7)
            ax.set_xlim(-0.6, PERCENTILE_RUNS_PER_ROW - 0.4)  # every row's bars the same width
            ax.set_ylabel("steps")
            ax.set_title(f"{metric}: p50 (solid), p99 (light)\n(lower is better)", fontsize=10)
            ax.set_ylim(0, tops[metric] * 1.2)
            ax.grid(axis="y", alpha=0.3)
    return fig
