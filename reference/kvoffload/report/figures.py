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

from kvoffload.metrics import GLOSSARY
from kvoffload.report.sources import RunFile
from kvoffload.results import atomic_output

DEFINITIONS = {name: definition for name, _, definition in GLOSSARY}
ABLATION_METRICS = ("last_block_hit_rate", "poisoned_loads", "lifecycle_violations", "offload_hit_rate")
CAPACITY_METRICS = ("offload_hit_rate", "last_block_hit_rate")
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


def footer(fig: Figure, runs: Sequence[RunFile], varied: tuple[str, ...] = ()) -> None:
    commits = sorted({(run.commit or "unknown")[:12] + ("-dirty" if (run.commit or "").endswith("-dirty") else "")
                      for run in runs})
    config = runs[0].config if runs else {}
    shape = ", ".join(f"{key}={config[key]}" for key in ("gpu_blocks", "cpu_chunks", "blocks_per_chunk",
                                                         "scheduling", "seed") if key in config and key not in varied)
    text = f"{len(runs)} result files; commit {', '.join(commits)}; {shape}"
    fig.text(0.01, 0.01, text, fontsize=7, color="#555555")


def save_chart(fig: Figure, out: Path, filename: str) -> str:
    save_figure(fig, out / filename)
    return filename


def number_or_none(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _format(metric: str):
    if metric.endswith("_rate"):
        return lambda v: f"{v:.3f}"
    return lambda v: f"{v:g}"


def tick_labels(runs: Sequence[RunFile]) -> list[str]:
    return [run.label.replace(" -", "\n-") + (" (crashed)" if run.crashed else "") for run in runs]


# ---- (a) fix ablation -----------------------------------------------------------------------


ZERO_METRICS = ("poisoned_loads", "lifecycle_violations")  # must be 0: any other value is a bug shown
WARNING_COLOR = "#d62728"


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
    return [WARNING_COLOR if metric in ZERO_METRICS and number_or_none(run.metrics.get(metric)) not in (None, 0)
            else label_color(run.label) for run in runs]


def draw_ablation(runs: Sequence[RunFile], out: Path) -> list[Chart]:
    """Per workload: the reference, each fix off in turn, each preset; one panel per metric.

    A must-be-0 metric that is not 0 is drawn in the warning colour and labelled; a panel whose
    runs are all 0 or all n/a says so in words, and the title counts what the files hold.
    """
    charts = []
    for workload, group in by_workload(runs).items():
        chosen = ablation_set(group)
        groups = ablation_groups(chosen)
        ordered = [run for _, members in groups for run in members]
        width = max(5.5, 0.42 * len(ordered) + 1.6)
        fig = Figure(figsize=(2 * width, 2 * 4.2), layout="constrained")
        for ax, metric in zip(fig.subplots(2, 2).ravel(), ABLATION_METRICS):
            _ablation_panel(ax, metric, ordered, groups)
        fixes_off = sum(len(members) for name, members in groups if name == "reference, one fix off")
        presets = sum(len(members) for name, members in groups if name == "vLLM presets")
        fig.suptitle(f"Fix ablation: {workload}: the reference, {fixes_off} fix flag(s) off in turn, "
                     f"{presets} vLLM preset(s)", fontsize=12)
        footer(fig, ordered)
        fig.get_layout_engine().set(rect=(0, 0.03, 1, 0.97))
        filename = save_chart(fig, out, f"ablation-{slug(workload)}.png")
        caption = ("Bars: green the reference (every fix), orange the reference with one fix flag off, blue a "
                   f"vLLM release preset; red: a must-be-0 count that is not 0. "
                   + "; ".join(f"{m}: {DEFINITIONS[m]}" for m in ABLATION_METRICS))
        charts.append(Chart(FIX_VALUE, f"fix ablation: {workload}", filename, caption, run_provenance(ordered),
                            table=run_table(ordered, ABLATION_METRICS)))
    return charts


def _ablation_panel(ax, metric: str, ordered: Sequence[RunFile], groups) -> None:
    values = [number_or_none(run.metrics.get(metric)) for run in ordered]
    colors = ablation_colors(metric, ordered)
    warn = [color == WARNING_COLOR for color in colors]
    x = list(range(len(ordered)))
    bars = ax.bar(x, [0.0 if v is None else v for v in values], color=colors,
                  hatch=["//" if run.crashed else "" for run in ordered], edgecolor="white")
    for bar, value, w in zip(bars, values, warn):
        text = "n/a" if value is None else _format(metric)(value)
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, 0.0 if value is None else value), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7 if not w else 8,
                    color=WARNING_COLOR if w else "black", fontweight="bold" if w else "normal", rotation=90)
    direction = "higher is better" if metric.endswith("_rate") else "must be 0"
    ax.set_title(f"{metric} ({direction})", fontsize=10, pad=14)
    ax.set_xticks(x, [label.removeprefix("reference\n") for label in tick_labels(ordered)], rotation=40,
                  ha="right", fontsize=7)
    known = [v for v in values if v is not None]
    if metric.endswith("_rate"):
        ax.set_ylim(0, 1.25)
    else:
        ax.set_ylim(0, max(1.0, max(known + [0.0]) * 1.3))
    if not known:
        ax.text(0.5, 0.55, f"n/a for every run: {_NA_REASONS.get(metric, 'no value in these results')}",
                transform=ax.transAxes, ha="center", va="center", fontsize=9, color="#555555", wrap=True)
    elif metric in ZERO_METRICS and not any(warn):
        ax.text(0.5, 0.55, "0 for every run", transform=ax.transAxes, ha="center", va="center", fontsize=10,
                color=REFERENCE_COLOR)
    start = 0
    for name, members in groups:  # group separators and names under the bars
        if start:
            ax.axvline(start - 0.5, color="#999999", linewidth=0.8)
        ax.annotate(name, ((start + start + len(members) - 1) / 2, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7,
                    color="#555555")
        start += len(members)
    ax.set_xlim(-0.6, len(ordered) - 0.4)
    ax.grid(axis="y", alpha=0.3)


_NA_REASONS = {"last_block_hit_rate": "no continuation of a finished request here (last_block_eligible 0)"}


def run_table(runs: Sequence[RunFile], metrics: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The chart's data, one row per run: label, result file, commit, then each metric (CSV)."""
    header = ("workload", "connector", "cpu_chunks", "result file", "commit", *metrics)
    return (header, *((run.workload, run.label, str(run.config.get("cpu_chunks", "")), str(run.path),
                       run.commit or "", *("" if number_or_none(run.metrics.get(m)) is None else repr(run.metrics[m])
                                           for m in metrics)) for run in runs))


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
                ys = [number_or_none(run.metrics.get(metric)) for run in points]
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
        footer(fig, [run for points in series.values() for run in points], varied=("cpu_chunks",))
        fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))
        filename = save_chart(fig, out, f"capacity-{slug(workload)}.png")
        charts.append(Chart(RELEASE_LOSS, f"hit rate against CPU capacity: {workload}", filename,
                            "runs that differ only in config.cpu_chunks; "
                            + "; ".join(f"{m}: {DEFINITIONS[m]}" for m in CAPACITY_METRICS),
                            run_provenance([run for points in series.values() for run in points]),
                            table=run_table([run for points in series.values() for run in points],
                                            CAPACITY_METRICS)))
    return charts


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
