"""One function per kind of figure; each takes parsed result files and writes PNGs into ``out``.

Figures are drawn with matplotlib's object API (``matplotlib.figure.Figure``, Agg canvas): no
pyplot, no global backend switch, nothing shown. File names are stable (derived from the
workload or benchmark name), so a report drawn twice from the same files is the same report.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kvoffload.metrics import GLOSSARY
from kvoffload.report.sources import RunFile
from kvoffload.results import atomic_output

DEFINITIONS = {name: definition for name, _, definition in GLOSSARY}
ABLATION_METRICS = ("last_block_hit_rate", "poisoned_loads", "lifecycle_violations", "offload_hit_rate")
CAPACITY_METRICS = ("offload_hit_rate", "last_block_hit_rate")
DELAY_METRICS = ("store_submit_delay_steps", "store_visible_delay_steps")
FILE_PATTERNS = ("ablation-*.png", "capacity-*.png", "store-delays-*.png", "asv-*.png",
                 "ablation-*.csv", "capacity-*.csv", "store-delays-*.csv", "asv-*.csv")

# The report's sections: the questions a reader brings, in the page's order.
REGRESSION = "Did this commit regress?"
FIX_VALUE = "What does each fix buy?"
RELEASE_LOSS = "What did each release lose?"
SECTIONS = (REGRESSION, FIX_VALUE, RELEASE_LOSS)

REFERENCE_COLOR, FIX_OFF_COLOR, PRESET_COLOR, OTHER_COLOR = "#2a9d55", "#e07b39", "#3b6fb6", "#888888"


@dataclass(frozen=True)
class HoverBox:
    """A region of a figure, in percent of its width and height from the top left, and the text
    the HTML page shows when the pointer rests on it (a commit's id, date and subject)."""

    left: float
    top: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class Chart:
    """A written figure, as the index lists it."""

    section: str
    title: str
    filename: str
    caption: str
    provenance: tuple[tuple[str, ...], ...] = ()  # a header row, then one row per source of its points
    table: tuple[tuple[str, ...], ...] = ()  # the data drawn: a header row, then one row per value (CSV)
    hover: tuple[HoverBox, ...] = ()

    @property
    def data_file(self) -> str:
        """The CSV of ``table``, beside the figure."""
        return Path(self.filename).with_suffix(".csv").name


def save_figure(fig: Figure, path: Path, dpi: int = 110) -> None:
    """The PNG written whole or not at all (an interrupt leaves no truncated image)."""
    with atomic_output(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=dpi)


def run_provenance(runs: Sequence[RunFile]) -> tuple[tuple[str, ...], ...]:
    """Where each bar or line of a run-result chart comes from: the result file and its commit."""
    header = ("connector", "cpu_chunks", "result file", "commit")
    return (header, *((run.label, str(run.config.get("cpu_chunks", "")), str(run.path), run.commit or "unknown")
                      for run in runs))


# ---- grouping and styling -------------------------------------------------------------------


def label_order(labels: Sequence[str]) -> list[str]:
    """reference, then the reference with fixes off, then presets in release order, then others."""

    def key(label: str):
        if label == "reference":
            kind = 0
        elif label.startswith("reference "):
            kind = 1
        elif label.startswith("vllm-"):
            kind = 2
        else:
            kind = 3
        natural = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]
        return kind, natural

    return sorted(set(labels), key=key)


def label_color(label: str) -> str:
    if label == "reference":
        return REFERENCE_COLOR
    if label.startswith("reference "):
        return FIX_OFF_COLOR
    if label.startswith("vllm-"):
        return PRESET_COLOR
    return OTHER_COLOR


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_") or "x"


def by_workload(runs: Sequence[RunFile]) -> dict[str, list[RunFile]]:
    groups: dict[str, list[RunFile]] = defaultdict(list)
    for run in runs:
        groups[run.workload].append(run)
    return dict(sorted(groups.items()))


def ablation_set(runs: Sequence[RunFile]) -> list[RunFile]:
    """One run per connector label, all of one configuration (a workload's runs of the same config).

    The configuration shared by the most connector labels wins (ties: the first in path order),
    so a capacity sweep beside a bench run does not mix into the comparison. Of duplicates of a
    label, the last in path order counts.
    """
    families: dict[str, dict[str, RunFile]] = {}
    for run in runs:
        families.setdefault(run.config_key, {})[run.label] = run
    best = max(families.values(), key=len)  # max keeps the first of equals: path order
    return [best[label] for label in label_order(best)]


def _footer(fig: Figure, runs: Sequence[RunFile], varied: tuple[str, ...] = ()) -> None:
    commits = sorted({(run.commit or "unknown")[:12] + ("-dirty" if (run.commit or "").endswith("-dirty") else "")
                      for run in runs})
    config = runs[0].config if runs else {}
    shape = ", ".join(f"{key}={config[key]}" for key in ("gpu_blocks", "cpu_chunks", "blocks_per_chunk",
                                                         "scheduling", "seed") if key in config and key not in varied)
    text = f"{len(runs)} result files; commit {', '.join(commits)}; {shape}"
    fig.text(0.01, 0.01, text, fontsize=7, color="#555555")


def _save(fig: Figure, out: Path, filename: str) -> str:
    save_figure(fig, out / filename)
    return filename


def _bar_labels(ax, bars, values, fmt) -> None:
    for bar, value in zip(bars, values):
        text = "n/a" if value is None else fmt(value)
        height = 0.0 if value is None else value
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, height), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _format(metric: str):
    if metric.endswith("_rate"):
        return lambda v: f"{v:.3f}"
    return lambda v: f"{v:g}"


def _tick_labels(runs: Sequence[RunFile]) -> list[str]:
    return [run.label.replace(" -", "\n-") + (" (crashed)" if run.crashed else "") for run in runs]


# ---- (a) fix ablation -----------------------------------------------------------------------


def draw_ablation(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    charts = []
    for workload, group in by_workload(runs).items():
        chosen = ablation_set(group)
        fig = Figure(figsize=(4.2 * len(ABLATION_METRICS), 4.6), layout="constrained")
        axes = fig.subplots(1, len(ABLATION_METRICS))
        x = range(len(chosen))
        for ax, metric in zip(axes, ABLATION_METRICS):
            values = [_number(run.metrics.get(metric)) for run in chosen]
            bars = ax.bar(x, [0.0 if v is None else v for v in values],
                          color=[label_color(run.label) for run in chosen],
                          hatch=["//" if run.crashed else "" for run in chosen], edgecolor="white")
            _bar_labels(ax, bars, values, _format(metric))
            direction = "higher is better" if metric.endswith("_rate") else "must be 0"
            ax.set_title(f"{metric}\n({direction})", fontsize=10)
            ax.set_xticks(list(x), _tick_labels(chosen), rotation=30, ha="right", fontsize=8)
            if metric.endswith("_rate"):
                ax.set_ylim(0, 1.12)
            else:
                top = max([v for v in values if v is not None] + [0.0])
                ax.set_ylim(0, max(1.0, top * 1.15))
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"Fix ablation: {workload} (reference vs fixes off vs vLLM presets)", fontsize=12)
        _footer(fig, chosen)
        fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))
        filename = _save(fig, out, f"ablation-{slug(workload)}.png")
        caption = "; ".join(f"{m}: {DEFINITIONS[m]}" for m in ABLATION_METRICS)
        charts.append(Chart(FIX_VALUE, f"{workload}: reference vs fixes off vs presets", filename, caption,
                            run_provenance(chosen)))
    return charts


# ---- (b) hit rate against CPU capacity --------------------------------------------------------


def capacity_series(runs: Sequence[RunFile]) -> dict[str, dict[str, list[RunFile]]]:
    """{workload: {series label: runs by cpu_chunks}} for runs that differ only in cpu_chunks.

    A series needs at least two capacities. Its label is the connector label, with a number
    added when one connector has several such families (other settings differ between them).
    """
    found: dict[str, dict[str, list[RunFile]]] = {}
    for workload, group in by_workload(runs).items():
        families: dict[tuple[str, str], dict[int, RunFile]] = defaultdict(dict)
        for run in group:
            chunks = run.config.get("cpu_chunks")
            if isinstance(chunks, int):
                families[(run.label, run.config_key_without("cpu_chunks"))][chunks] = run
        series: dict[str, list[RunFile]] = {}
        counts: dict[str, int] = defaultdict(int)
        for (label, _), by_chunks in sorted(families.items(), key=lambda item: label_order([item[0][0]])):
            if len(by_chunks) < 2:
                continue
            counts[label] += 1
            name = label if counts[label] == 1 else f"{label} ({counts[label]})"
            series[name] = [by_chunks[c] for c in sorted(by_chunks)]
        if series:
            found[workload] = dict(sorted(series.items(), key=lambda item: label_order([item[0]])[0]))
    return found


def draw_capacity(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    charts = []
    for workload, series in capacity_series(runs).items():
        fig = Figure(figsize=(5.2 * len(CAPACITY_METRICS), 4.4), layout="constrained")
        axes = fig.subplots(1, len(CAPACITY_METRICS))
        for ax, metric in zip(axes, CAPACITY_METRICS):
            for name, points in series.items():
                xs = [run.config["cpu_chunks"] for run in points]
                ys = [_number(run.metrics.get(metric)) for run in points]
                ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o",
                        color=label_color(points[0].label), label=name)
            ax.set_xscale("log", base=2)
            chunks = sorted({run.config["cpu_chunks"] for points in series.values() for run in points})
            ax.set_xticks(chunks, [str(c) for c in chunks], fontsize=8)
            ax.minorticks_off()
            ax.set_xlabel("cpu_chunks (offload-tier capacity, chunks)")
            ax.set_ylabel(metric)
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{metric} (higher is better)", fontsize=10)
            ax.grid(alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)
        fig.suptitle(f"Hit rate against CPU capacity: {workload}", fontsize=12)
        _footer(fig, [run for points in series.values() for run in points], varied=("cpu_chunks",))
        fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))
        filename = _save(fig, out, f"capacity-{slug(workload)}.png")
        charts.append(Chart(RELEASE_LOSS, f"hit rate against CPU capacity: {workload}", filename,
                            "runs that differ only in config.cpu_chunks; "
                            + "; ".join(f"{m}: {DEFINITIONS[m]}" for m in CAPACITY_METRICS),
                            run_provenance([run for points in series.values() for run in points])))
    return charts


# ---- (c) store delays -----------------------------------------------------------------------


def draw_store_delays(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    """Per workload: the full delay distributions (cumulative) where every run keeps them, else
    the p50/p99 bars of the percentiles a result always has."""
    charts = []
    for workload, group in by_workload(runs).items():
        chosen = ablation_set(group)
        full = all(metric in run.distributions for run in chosen for metric in DELAY_METRICS)
        fig = _delay_distributions(chosen) if full else _delay_percentiles(chosen)
        fig.suptitle(f"Store delays: {workload}", fontsize=12)
        _footer(fig, chosen)
        fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))
        filename = _save(fig, out, f"store-delays-{slug(workload)}.png")
        kept = ("the whole distribution of each run (share of stored chunks with a delay of at most x steps)" if full
                else "p50 and p99 of each run (these result files keep the percentiles only)")
        charts.append(Chart(RELEASE_LOSS, f"store delays: {workload}", filename,
                            f"{kept}. store_submit_delay_steps: {DEFINITIONS['store_submit_delay_steps_p50']}; "
                            f"store_visible_delay_steps: {DEFINITIONS['store_visible_delay_steps_p50']}",
                            run_provenance(chosen)))
    return charts


def _delay_distributions(chosen: Sequence[RunFile]) -> Figure:
    fig = Figure(figsize=(12.0, 4.6), layout="constrained")
    axes = fig.subplots(1, len(DELAY_METRICS))
    colors = distinct_colors([run.label for run in chosen])
    for ax, metric in zip(axes, DELAY_METRICS):
        for run in sorted(chosen, key=lambda r: r.label == "reference"):  # the reference drawn last, on top
            counts = run.distributions[metric]
            total = sum(counts.values())
            if not total:
                continue
            xs, ys, seen = [], [], 0
            for steps in sorted(counts):
                seen += counts[steps]
                xs.append(steps)
                ys.append(seen / total)
            is_reference = run.label == "reference"
            ax.step(xs, ys, where="post", color=colors[run.label], linewidth=2.4 if is_reference else 1.3,
                    zorder=4 if is_reference else 2, label=f"{run.label} ({total} chunks)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # delays are whole steps
        ax.set_xlabel("delay (engine steps)")
        ax.set_ylabel("share of stored chunks (cumulative)")
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=-0.5)
        ax.set_title(f"{metric}\n(left and high is better)", fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: label_order([r.label for r in chosen]).index(labels[i].split(" (")[0]))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside right upper", fontsize=8)
    return fig


def _delay_percentiles(chosen: Sequence[RunFile]) -> Figure:
    fig = Figure(figsize=(max(8.0, 1.6 * len(chosen) * len(DELAY_METRICS)), 4.4), layout="constrained")
    axes = fig.subplots(1, len(DELAY_METRICS))
    width = 0.38
    for ax, metric in zip(axes, DELAY_METRICS):
        x = list(range(len(chosen)))
        for offset, (pct, alpha) in zip((-width / 2, width / 2), (("p50", 1.0), ("p99", 0.45))):
            values = [_number(run.metrics.get(f"{metric}_{pct}")) for run in chosen]
            bars = ax.bar([i + offset for i in x], [0.0 if v is None else v for v in values], width,
                          color=[label_color(run.label) for run in chosen], alpha=alpha, label=pct)
            _bar_labels(ax, bars, values, lambda v: f"{v:g}")
        ax.set_xticks(x, _tick_labels(chosen), rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("steps")
        ax.set_title(f"{metric}: p50 (solid), p99 (light)\n(lower is better)", fontsize=10)
        top = max([_number(run.metrics.get(f"{metric}_p99")) or 0.0 for run in chosen] + [1.0])
        ax.set_ylim(0, top * 1.2)
        ax.grid(axis="y", alpha=0.3)
    return fig


_FIX_OFF_SHADES = ("#e07b39", "#b5541b", "#f0a470", "#8c3b0d", "#f6c8a4")
_PRESET_SHADES = ("#1f3f73", "#3b6fb6", "#7fa6dd", "#6a3d9a", "#17becf", "#8c564b")


def distinct_colors(labels: Sequence[str]) -> dict[str, str]:
    """One colour per label: the reference green, fixes off in oranges, presets in blues and
    further hues, in label order (a line chart needs each line told apart, unlike the bars)."""
    colors, fix_off, presets, others = {}, 0, 0, 0
    for label in label_order(labels):
        if label == "reference":
            colors[label] = REFERENCE_COLOR
        elif label.startswith("reference "):
            colors[label], fix_off = _FIX_OFF_SHADES[fix_off % len(_FIX_OFF_SHADES)], fix_off + 1
        elif label.startswith("vllm-"):
            colors[label], presets = _PRESET_SHADES[presets % len(_PRESET_SHADES)], presets + 1
        else:
            colors[label], others = OTHER_COLOR, others + 1
    return colors
