"""One function per kind of figure; each takes parsed result files and writes PNGs into ``out``.

Figures are drawn with matplotlib's object API (``matplotlib.figure.Figure``, Agg canvas): no
pyplot, no global backend switch, nothing shown. File names are stable (derived from the
workload or benchmark name), so a report drawn twice from the same files is the same report.

Every figure is at most ``MAX_FIGURE_WIDTH_PX`` wide, so the page shows it at 1:1 and its
text stays legible: figures with many runs grow in height (more rows), never in width.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure

from kvoffload.metrics import DIRECTION, GLOSSARY, MEASURED_METRICS, same_value
from kvoffload.report.sources import RunFile
from kvoffload.results import atomic_output

DEFINITIONS = {name: definition for name, _, definition in GLOSSARY}
CAPACITY_METRICS = ("offload_hit_rate", "last_block_hit_rate")
FILE_PATTERNS = ("ablation-*.png", "capacity-*.png", "store-delays-*.png", "asv-*.png",
                 "ablation-*.csv", "capacity-*.csv", "store-delays-*.csv", "asv-*.csv")

# The report's sections: the questions a reader brings, in the page's order.
REGRESSION = "Did this commit regress?"
FIX_VALUE = "What does each fix buy?"
RELEASE_LOSS = "What did each release lose?"
SECTIONS = (REGRESSION, FIX_VALUE, RELEASE_LOSS)

# The widest figure the page (report.page) shows at 1:1 in a 1400 px wide window: less a scroll
# bar (Chromium's is 15 px), the body's padding (2 * 16 px) and the image's border (2 px), 1351 px
# are left; the browser test checks every image is drawn at its own width there.
MAX_FIGURE_WIDTH_PX = 1340
DPI = 110

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


def max_width_inches(dpi: int = DPI) -> float:
    """The widest figure, in inches at ``dpi``, that ``save_figure`` accepts."""
    return MAX_FIGURE_WIDTH_PX / dpi


def save_figure(fig: Figure, path: Path, dpi: int = DPI) -> None:
    """The PNG written whole or not at all (an interrupt leaves no truncated image).

    A figure wider than ``MAX_FIGURE_WIDTH_PX`` is a layout bug (the page would shrink its text
    below legibility): ValueError, nothing written."""
    width_px = round(fig.get_figwidth() * dpi)
    if width_px > MAX_FIGURE_WIDTH_PX:
        raise ValueError(f"{path.name}: {width_px} px wide, over the page's {MAX_FIGURE_WIDTH_PX} px")
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


# The characters a name (a workload's, a benchmark's) keeps in a file name; every other one is
# written as ~XX per UTF-8 byte. A slug longer than LONGEST_SLUG is cut and ends in ~~ and 16 hex
# digits of the name's SHA-256 ("~~" occurs in no other slug: "~" is always followed by two hex
# digits), so a file name stays within any file system's 255 bytes.
_KEPT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
LONGEST_SLUG = 120


def slug(text: str) -> str:
    """``text`` as part of a file name, one to one: two names never share a file (``a/b`` is
    ``a~2fb``, ``a_b`` stays ``a_b``), a name of only letters, digits, '.', '_' and '-' is kept
    as it is, and a long one is shortened with a hash of the whole (``LONGEST_SLUG``)."""
    raw = text.encode("utf-8", "surrogatepass")
    kept = "".join(c if c in _KEPT else "".join(f"~{byte:02x}" for byte in c.encode("utf-8", "surrogatepass"))
                   for c in text)
    if len(kept) <= LONGEST_SLUG:
        return kept
    import hashlib

    return kept[:LONGEST_SLUG - 18] + "~~" + hashlib.sha256(raw).hexdigest()[:16]


def by_workload(runs: Sequence[RunFile]) -> dict[str, list[RunFile]]:
    groups: dict[str, list[RunFile]] = defaultdict(list)
    for run in runs:
        groups[run.workload].append(run)
    return dict(sorted(groups.items()))


def ablation_set(runs: Sequence[RunFile]) -> list[RunFile]:
    """One run per connector label, all of one configuration (a workload's runs of the same config).

    The configuration shared by the most connector labels wins (ties: the first in path order),
    so a capacity sweep beside a bench run does not mix into the comparison. Of two files for one
    label (a bench run and the same run of a capacity sweep), the last in path order counts; the
    chart's caption names both (``passed_over_note``).
    """
    families: dict[str, dict[str, RunFile]] = {}
    for run in runs:
        families.setdefault(run.config_key, {})[run.label] = run  # passed_over names the replaced one
    best = max(families.values(), key=len)  # max keeps the first of equals: path order
    return [best[label] for label in label_order(best)]


def direction_text(metric: str) -> str:
    """What a good value of ``metric`` is, from the glossary (its one owner)."""
    return {"higher": "higher is better", "lower": "lower is better", "zero": "must be 0"}.get(
        DIRECTION.get(metric, "info"), "no direction")


def passed_over(drawn: Sequence[RunFile], runs: Sequence[RunFile]) -> list[tuple[RunFile, RunFile]]:
    """(drawn, passed over) for each run of ``runs`` that one of ``drawn`` stands for: the same
    workload, connector label, commit and configuration (two files for one bar or point)."""
    def key(run: RunFile):
        return run.workload, run.label, run.commit, run.config_key

    shown = {key(run): run for run in drawn}
    return [(shown[key(run)], run) for run in runs if key(run) in shown and shown[key(run)] is not run]


def passed_over_note(pairs: Sequence[tuple[RunFile, RunFile]]) -> str:
    """A caption sentence naming, for each bar drawn from one of two files, the file drawn and the
    file passed over, and whether their deterministic metrics agree; "" where there are none."""
    parts = []
    for drawn, other in pairs:
        differ = sorted(name for name in set(drawn.metrics) | set(other.metrics) if name not in MEASURED_METRICS
                        and not same_value(number_or_none(drawn.metrics.get(name)),
                                           number_or_none(other.metrics.get(name))))
        verdict = (f"they differ in {', '.join(differ)}" if differ
                   else "their deterministic metrics are equal")
        parts.append(f"{drawn.label}: drawn from {drawn.path}, {other.path} passed over ({verdict})")
    if not parts:
        return ""
    return ("Two result files for one bar or point (same workload, connector, commit and configuration; the "
            "later in path order is drawn): " + "; ".join(parts) + ".")


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


def tick_labels(runs: Sequence[RunFile]) -> list[str]:
    return [run.label.replace(" -", "\n-") + (" (crashed)" if run.crashed else "") for run in runs]


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
                families[(run.label, run.config_key_without("cpu_chunks"))][chunks] = run  # see passed_over
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
        drawn = [run for points in series.values() for run in points]
        duplicates = passed_over_note(passed_over(drawn, by_workload(runs)[workload]))
        charts.append(Chart(RELEASE_LOSS, f"hit rate against CPU capacity: {workload}", filename,
                            "runs that differ only in config.cpu_chunks; " + (duplicates + " " if duplicates else "")
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
