"""(c) store delays per workload: each run's whole delay distribution, as bars side by side.

Delays are whole engine steps and take few values, so each distribution is drawn as bars (the
share of stored chunks at each delay), the runs of a workload side by side at every delay, each
with its own colour and hatch: a distribution of one value is one full bar, and two runs with the
same distribution stand next to each other instead of one line hiding the other. Where a run's
file keeps only the percentiles, its p50 and p99 are drawn instead.
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
    number_or_none,
    run_provenance,
    save_chart,
    slug,
    tick_labels,
)
from kvoffload.report.sources import RunFile

DELAY_METRICS = ("store_submit_delay_steps", "store_visible_delay_steps")
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--")


def draw_store_delays(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    """Per workload: the full delay distributions where every run keeps them, else the p50/p99 bars."""
    charts = []
    for workload, group in by_workload(runs).items():
        chosen = sorted(ablation_set(group), key=lambda run: label_order([r.label for r in group]).index(run.label))
        full = all(metric in run.distributions for run in chosen for metric in DELAY_METRICS)
        fig = _delay_distributions(chosen) if full else _delay_percentiles(chosen)
        fig.suptitle(f"Store delays: {workload}", fontsize=12)
        footer(fig, chosen)
        fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))
        filename = save_chart(fig, out, f"store-delays-{slug(workload)}.png")
        kept = ("the whole distribution of each run: the share of its stored chunks at each delay, the runs side by "
                "side at every delay" if full
                else "p50 and p99 of each run (these result files keep the percentiles only)")
        charts.append(Chart(RELEASE_LOSS, f"store delays: {workload}", filename,
                            f"{kept}. store_submit_delay_steps: {DEFINITIONS['store_submit_delay_steps_p50']}; "
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
    delays = sorted({steps for run in chosen for metric in DELAY_METRICS for steps in run.distributions[metric]})
    span = (max(delays) - min(delays) + 1) if delays else 1
    fig = Figure(figsize=(max(12.0, 2 * (2.0 + 0.22 * span * len(chosen))), 4.8), layout="constrained")
    axes = fig.subplots(1, len(DELAY_METRICS))
    colors = distinct_colors([run.label for run in chosen])
    width = 0.84 / max(1, len(chosen))
    for ax, metric in zip(axes, DELAY_METRICS):
        for i, run in enumerate(chosen):
            counts = run.distributions[metric]
            total = sum(counts.values())
            steps = sorted(counts)
            offset = (i - (len(chosen) - 1) / 2) * width
            ax.bar([s + offset for s in steps], [counts[s] / total if total else 0.0 for s in steps], width,
                   color=colors[run.label], hatch=HATCHES[i % len(HATCHES)], edgecolor="white", linewidth=0.5,
                   label=f"{run.label} ({total} chunks)")
        shown = sorted({s for run in chosen for s in run.distributions[metric]})
        if shown and shown[-1] - shown[0] <= 30:  # delays are whole steps: one tick each
            ax.set_xticks(range(shown[0], shown[-1] + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if shown:
            ax.set_xlim(shown[0] - 0.6, shown[-1] + 0.6)
        ax.set_xlabel("delay (engine steps)")
        ax.set_ylabel("share of stored chunks")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{metric}\n(more on the left is better)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    return fig


def _delay_percentiles(chosen: Sequence[RunFile]) -> Figure:
    fig = Figure(figsize=(max(8.0, 1.6 * len(chosen) * len(DELAY_METRICS)), 4.4), layout="constrained")
    axes = fig.subplots(1, len(DELAY_METRICS))
    width = 0.38
    for ax, metric in zip(axes, DELAY_METRICS):
        x = list(range(len(chosen)))
        for offset, (pct, alpha) in zip((-width / 2, width / 2), (("p50", 1.0), ("p99", 0.45))):
            values = [number_or_none(run.metrics.get(f"{metric}_{pct}")) for run in chosen]
            bars = ax.bar([i + offset for i in x], [0.0 if v is None else v for v in values], width,
                          color=[label_color(run.label) for run in chosen], alpha=alpha, label=pct)
            for bar, value in zip(bars, values):
                ax.annotate("n/a" if value is None else f"{value:g}",
                            (bar.get_x() + bar.get_width() / 2, 0.0 if value is None else value), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, tick_labels(chosen), rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("steps")
        ax.set_title(f"{metric}: p50 (solid), p99 (light)\n(lower is better)", fontsize=10)
        top = max([number_or_none(run.metrics.get(f"{metric}_p99")) or 0.0 for run in chosen] + [1.0])
        ax.set_ylim(0, top * 1.2)
        ax.grid(axis="y", alpha=0.3)
    return fig
