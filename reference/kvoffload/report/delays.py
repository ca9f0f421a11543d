"""(c) Store delays per workload, against the reference: when each run's chunks were stored.

The question is what a fix flag (or a preset) changes in *when* chunks reach the tier, so each
run is drawn as its difference from the reference: per delay d (whole engine steps), the share of
its stored chunks stored within d steps minus the reference's share, in percentage points. Above 0
the run stored more of its chunks by then. That is not "better": a run without
``final_token_watermark`` stores the chunk that ends on an unwritten slot a step early and poisons
the next turn's load, so each line names its poisoned loads beside it, and nothing here ranks runs.
Runs whose distributions equal the reference's are named under the title, not drawn.

Where a run's file keeps only the percentiles (no ``distributions``), its p50 and p99 are drawn
as differences from the reference's instead. Figures are bounded in width
(``figures.MAX_FIGURE_WIDTH_PX``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kvoffload.report.figures import (
    DEFINITIONS,
    FIX_VALUE,
    Chart,
    ablation_set,
    by_workload,
    distinct_colors,
    footer,
    label_order,
    max_width_inches,
    number_or_none,
    passed_over,
    passed_over_note,
    run_provenance,
    save_chart,
    slug,
)
from kvoffload.report.sources import RunFile

DELAY_METRICS = ("store_submit_delay_steps", "store_visible_delay_steps")
PANEL_HEIGHT_IN = 4.4
MIN_POINTS_AXIS = 2.0  # the y axis spans at least +-2 points
LEGEND_LINE_IN = 0.36  # one legend row (a label wraps to two lines at most)


def draw_store_delays(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    """Per workload with a reference run: each other run's delays as a difference from its."""
    charts = []
    for workload, group in by_workload(runs).items():
        chosen = sorted(ablation_set(group), key=lambda run: label_order([r.label for r in group]).index(run.label))
        reference = next((run for run in chosen if run.label == "reference"), None)
        if reference is None:
            continue  # nothing to measure against
        metrics = [m for m in DELAY_METRICS if all(m in run.distributions for run in chosen)]
        full = bool(metrics)
        metrics = metrics or [m for m in DELAY_METRICS if f"{m}_p50" in reference.metrics]
        # A crashed run stored only what it stored before the crash: its delays compare with nothing.
        crashed = [run.label for run in chosen if run is not reference and run.crashed]
        others = [run for run in chosen if run is not reference and not run.crashed]
        differing = [run for run in others if _differs(run, reference, metrics, full)]
        same = [run.label for run in others if run not in differing]
        fig = _figure(workload, reference, differing, metrics, full)
        parts = [f"same delays as the reference: {', '.join(same)}"] if same else []
        parts += [f"crashed, not drawn: {', '.join(crashed)}"] if crashed else []
        subtitle = "; ".join(parts)
        if not differing:
            subtitle = "every run stores its chunks with the reference's delays" + (f"; {parts[-1]}" if crashed else "")
        fig.suptitle(f"Store delays against the reference: {workload}"
                     + ("\n" + "\n".join(textwrap.wrap(subtitle, 150)) if subtitle else ""), fontsize=11)
        footer(fig, chosen)
        footer_in = 0.3 / fig.get_figheight()
        fig.get_layout_engine().set(rect=(0, footer_in, 1, 1 - footer_in))
        filename = save_chart(fig, out, f"store-delays-{slug(workload)}.png")
        kept = ("per delay d, the share of a run's stored chunks stored within d steps, minus the reference's "
                "share (percentage points; above 0: more of them by then)" if full
                else "each run's p50 and p99 minus the reference's (these result files keep the percentiles only)")
        duplicates = passed_over_note(passed_over(chosen, group))
        charts.append(Chart(FIX_VALUE, f"store delays: {workload}", filename,
                            f"{kept}. Earlier is not better: a run that stores a slot no forward wrote stores "
                            f"early and poisons a load, so each line names its poisoned loads. "
                            f"{subtitle + '. ' if subtitle else ''}{duplicates + ' ' if duplicates else ''}"
                            f"store_submit_delay_steps: {DEFINITIONS['store_submit_delay_steps_p50']}; "
                            f"store_visible_delay_steps: {DEFINITIONS['store_visible_delay_steps_p50']}",
                            run_provenance(chosen), table=delay_table(chosen)))
    return charts


def cumulative_shares(counts: dict[int, int], delays: Sequence[int]) -> list[float]:
    """Share of the chunks stored within each delay of ``delays`` (0 to 1)."""
    total = sum(counts.values())
    shares, seen = [], 0
    ordered = sorted(counts.items())
    index = 0
    for delay in delays:
        while index < len(ordered) and ordered[index][0] <= delay:
            seen += ordered[index][1]
            index += 1
        shares.append(seen / total if total else 0.0)
    return shares


def points_against(run: RunFile, reference: RunFile, metric: str, delays: Sequence[int]) -> list[float]:
    """The run's cumulative shares minus the reference's, in percentage points, per delay."""
    ours = cumulative_shares(run.distributions[metric], delays)
    theirs = cumulative_shares(reference.distributions[metric], delays)
    return [100.0 * (a - b) for a, b in zip(ours, theirs)]


def _differs(run: RunFile, reference: RunFile, metrics: Sequence[str], full: bool) -> bool:
    if full:
        return any(_shares(run.distributions[m]) != _shares(reference.distributions[m]) for m in metrics)
    return any(run.metrics.get(f"{m}_{pct}") != reference.metrics.get(f"{m}_{pct}")
               for m in metrics for pct in ("p50", "p99"))


def _shares(counts: dict[int, int]) -> dict[int, float]:
    total = sum(counts.values())
    return {steps: round(n / total, 9) for steps, n in counts.items()} if total else {}


def _run_name(run: RunFile) -> str:
    poisoned = number_or_none(run.metrics.get("poisoned_loads"))
    notes = [f"{poisoned:g} poisoned loads"] if poisoned else []
    notes += ["crashed"] if run.crashed else []
    return run.label + (f" ({', '.join(notes)})" if notes else "")


def _curve_groups(runs: Sequence[RunFile], reference: RunFile, metric: str,
                  delays: Sequence[int]) -> list[tuple[list[RunFile], list[float]]]:
    """Runs with the same difference curve drawn as one line (their names together): identical
    curves would otherwise hide one another."""
    groups: list[tuple[list[RunFile], list[float]]] = []
    for run in runs:
        points = points_against(run, reference, metric, delays)
        for members, curve in groups:
            if [round(p, 6) for p in curve] == [round(p, 6) for p in points]:
                members.append(run)
                break
        else:
            groups.append(([run], points))
    return groups


def _figure(workload: str, reference: RunFile, differing: Sequence[RunFile], metrics: Sequence[str],
            full: bool) -> Figure:
    legend_in = 0.3 + LEGEND_LINE_IN * -(-len(differing) // 2)  # two columns; more runs: taller, not wider
    fig = Figure(figsize=(max_width_inches(), PANEL_HEIGHT_IN + legend_in + 1.1), layout="constrained")
    grid = fig.add_gridspec(2, max(1, len(metrics)), height_ratios=(PANEL_HEIGHT_IN, legend_in))
    axes = [fig.add_subplot(grid[0, column]) for column in range(max(1, len(metrics)))]
    key = fig.add_subplot(grid[1, :])  # the legend's own row: never over a line, never over the footer
    key.axis("off")
    colors = distinct_colors([run.label for run in differing])
    for ax, metric in zip(axes, metrics):
        if full:
            delays = sorted({s for run in (reference, *differing) for s in run.distributions[metric]})
            span = MIN_POINTS_AXIS
            styles = ("-", "--", ":", "-.")
            for index, (members, points) in enumerate(_curve_groups(differing, reference, metric, delays)):
                span = max(span, *(abs(p) for p in points))
                ax.step(delays, points, where="post", color=colors[members[0].label], linewidth=1.8,
                        linestyle=styles[index % len(styles)], label="; ".join(_run_name(run) for run in members))
            if delays and delays[-1] - delays[0] <= 30:
                ax.set_xticks(range(delays[0], delays[-1] + 1))
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("delay d (engine steps)", fontsize=9)
            ax.set_ylabel("stored within d steps: run - reference (points)", fontsize=8)
            ref_p50 = reference.metrics.get(f"{metric}_p50")
            ax.set_title(f"{metric}\n(the reference: p50 {ref_p50}, {sum(reference.distributions[metric].values())} "
                         "chunks)", fontsize=10)
        else:
            span = _percentile_bars(ax, metric, reference, differing, colors)
        ax.axhline(0, color="#333333", linewidth=0.8)
        ax.set_ylim(-span * 1.25, span * 1.25)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    if differing:
        handles, labels = axes[0].get_legend_handles_labels()
        if handles:
            key.legend(handles, ["\n".join(textwrap.wrap(label, 90)) for label in labels], loc="upper center",
                       ncols=min(2, len(labels)), fontsize=8, frameon=False)
    else:
        for ax in axes:
            ax.text(0.5, 0.5, "no run differs from the reference", transform=ax.transAxes, ha="center",
                    va="center", color="0.4")
    return fig


def _percentile_bars(ax, metric: str, reference: RunFile, differing: Sequence[RunFile], colors) -> float:
    """p50 and p99 of each run minus the reference's, in steps."""
    span = 1.0
    x = list(range(len(differing)))
    for offset, pct, alpha in ((-0.19, "p50", 1.0), (0.19, "p99", 0.5)):
        base = number_or_none(reference.metrics.get(f"{metric}_{pct}")) or 0.0
        values = [(number_or_none(run.metrics.get(f"{metric}_{pct}")) or 0.0) - base for run in differing]
        span = max([span] + [abs(v) for v in values])
        ax.bar([i + offset for i in x], values, 0.38, alpha=alpha, label=pct,
               color=[colors[run.label] for run in differing])
    ax.set_xticks(x, [_run_name(run) for run in differing], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("steps, run - reference", fontsize=8)
    ax.set_title(f"{metric}: p50 (solid), p99 (light) against the reference", fontsize=10)
    return span


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
