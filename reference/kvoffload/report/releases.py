"""The report's "vLLM releases": the measured release table, each real release beside its preset.

Reads ``releases/releases.json`` under the report's source (``kvoffload releases`` writes it)
and draws one figure per workload: a panel per deterministic metric of
``kvoffload.releases.TABLE_METRICS`` that takes more than one value somewhere, releases along x,
the release's stock connector as filled markers and the simulator with the release's preset as
hollow ones, sync and async. A metric with one value in every row (crashes 0 everywhere) is named
under the title instead of a flat panel on a default axis; a measured one (µs per step: one
sample per row on a shared machine, no spread) is left to the table. Counts start at 0; a rate's
axis spans its values with a margin, so a 3-point gap shows. Nothing is replayed here.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from kvoffload.metrics import MEASURED_METRICS, format_value
from kvoffload.release_io import check_release_table
from kvoffload.releases import SCHEDULINGS, SCHEMA, STEP_KINDS, TABLE_METRICS
from kvoffload.report.figures import DEFINITIONS, RELEASE_LOSS, Chart, max_width_inches, save_figure, slug
from kvoffload.report.sources import read_json

TABLE_PATH = Path("releases") / "releases.json"
FILE_PATTERNS = ("releases-*.png", "releases-*.csv")
SCHEDULING_COLORS = {"sync": "#3b6fb6", "async": "#e07b39"}


def read_release_table(source: Path) -> dict | None:
    """The release table under ``source``, or None where there is none; a malformed one (not
    JSON, or a key the charts read that is not what they take: ``release_io.check_release_table``)
    is a one-line ResultError naming the file."""
    path = source / TABLE_PATH
    if not os.path.lexists(path):
        return None
    data = read_json(path, "a release table")
    check_release_table(data, str(path), SCHEMA, SCHEDULINGS)
    return data


def draw_releases(source: Path, out: Path) -> tuple[list[Chart], str | None]:
    """The charts, and a note when there is nothing to draw (why, and the command that would)."""
    table = read_release_table(source)  # an earlier report's charts: removed by draw_report if not redrawn
    if table is None:
        return [], f"vLLM releases: no {source / TABLE_PATH} (kvoffload releases writes it)"
    releases = [entry["release"] for entry in table["releases"]]
    values: dict[str, list[tuple]] = {}  # workload -> (release, preset, scheduling, metric, real, simulated)
    agreements: dict[str, list[tuple]] = {}  # workload -> (release, scheduling, kind, share of requests)
    for entry in table["releases"]:
        for row in entry["rows"]:
            if "setup_error" in row:
                continue
            for kind, agreeing, total in (("hits", "agreeing", "requests"),
                                          *((k, f"{k}_agreeing", f"{k}_requests") for k in STEP_KINDS)):
                if row.get(total):
                    agreements.setdefault(row["workload"], []).append(
                        (entry["release"], row["scheduling"], kind, row[agreeing] / row[total]))
            real, simulated = row["release"]["metrics"], row["preset"]["metrics"]
            for metric in TABLE_METRICS:
                values.setdefault(row["workload"], []).append(
                    (entry["release"], entry["preset"], row["scheduling"], metric,
                     real.get(metric), simulated.get(metric)))
    charts = []
    for workload, points in values.items():
        filename = f"releases-{slug(workload)}.png"
        save_figure(_figure(workload, releases, points, agreements.get(workload, [])), out / filename)
        header = ("release", "preset", "scheduling", "metric", "release value", "preset value")
        rows = tuple((r, p, s, m, _cell(m, a), _cell(m, b)) for r, p, s, m, a, b in points)
        charts.append(Chart(
            RELEASE_LOSS, f"vLLM releases: {workload}", filename,
            "each real release's stock connector on vLLM's own scheduler (filled) beside the simulator with "
            "the preset that re-creates it (hollow; the reference for 0.31 and 0.32). "
            + "; ".join(f"{m}: {DEFINITIONS[m]}" for m in TABLE_METRICS),
            (("release table", "commit", "hash seed", "seconds"),
             (str(source / TABLE_PATH), _commits(table), str(table.get("hash_seed")), str(table.get("seconds")))),
            (header, *rows)))
    return charts, None


def _commits(table: dict) -> str:
    """The commit the rows were measured at (``kvoffload releases`` records it per row): the one
    commit, each commit with its row count when the table merges several, or that a table written
    before rows carried theirs cannot say."""
    counts = (table.get("provenance") or {}).get("commits") or {}
    if not counts or set(counts) == {"unknown"}:
        return "not recorded (a table written before rows carried their commit)"
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{commit} ({rows} rows)" for commit, rows in counts.items())


def _cell(metric: str, value) -> str:
    return "" if value is None else format_value(metric, value)


def drawn_metrics(points: list[tuple]) -> tuple[list[str], dict[str, str]]:
    """The metrics with a panel, and {metric: why not} for the others."""
    drawn, skipped = [], {}
    for metric in TABLE_METRICS:
        if metric in MEASURED_METRICS:
            skipped[metric] = "measured once per row (no spread): in the table"
            continue
        values = {v for p in points if p[3] == metric for v in (p[4], p[5]) if v is not None}
        if not values:
            skipped[metric] = "no value in any row"
        elif len(values) == 1:
            skipped[metric] = f"{format_value(metric, next(iter(values)))} in every row"
        else:
            drawn.append(metric)
    return drawn, skipped


AGREEMENT_MARKERS = {"hits": "o", "admitted": "s", "finished": "^"}


def _agreement_panel(ax, releases: list[str], agreements: list[tuple]) -> None:
    """Share of requests agreeing with the preset, per release: on first-admission hits, on the
    admission step, on the finish step (circle, square, triangle), sync and async."""
    position = {release: i for i, release in enumerate(releases)}
    for (scheduling, color), (kind, marker) in ((sc, km) for sc in SCHEDULING_COLORS.items()
                                                for km in AGREEMENT_MARKERS.items()):
        mine = [(position[r] + (-0.15 if scheduling == "sync" else 0.15), share)
                for r, s, k, share in agreements if s == scheduling and k == kind]
        if mine:
            ax.scatter(*zip(*mine), color=color, marker=marker, s=30, alpha=0.85, zorder=3)
    low = min(share for *_, share in agreements)
    ax.set_ylim(low - max((1 - low) * 0.15, 0.02), 1 + max((1 - low) * 0.1, 0.01))
    ax.set_xticks(range(len(releases)), releases, rotation=45, fontsize=8)
    ax.set_xlim(-0.5, len(releases) - 0.5)
    ax.set_title("requests agreeing\n(o hits, □ admission step, △ finish step)", fontsize=9)
    ax.grid(alpha=0.3)


def _figure(workload: str, releases: list[str], points: list[tuple], agreements: list[tuple] = ()) -> Figure:
    drawn, skipped = drawn_metrics(points)
    agreement_drawn = any(share < 1 for *_, share in agreements)
    if agreements and not agreement_drawn:
        skipped = {"requests agreeing": "every request on hits and steps, in every row", **skipped}
    columns = 4
    panels = len(drawn) + agreement_drawn
    rows = max(1, -(-(panels + 1) // columns))  # a spare panel for the legend
    fig = Figure(figsize=(max_width_inches(), 3.4 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    position = {release: i for i, release in enumerate(releases)}
    if agreement_drawn:
        _agreement_panel(axes[0], releases, list(agreements))
        axes = axes[1:]
    for ax, metric in zip(axes, drawn):
        for scheduling, color in SCHEDULING_COLORS.items():
            mine = [p for p in points if p[3] == metric and p[2] == scheduling]
            offset = -0.12 if scheduling == "sync" else 0.12
            real = [(position[p[0]] + offset, p[4]) for p in mine if p[4] is not None]
            simulated = [(position[p[0]] + offset, p[5]) for p in mine if p[5] is not None]
            if real:
                ax.scatter(*zip(*real), color=color, s=36, zorder=3, label=f"release, {scheduling}")
            if simulated:
                ax.scatter(*zip(*simulated), facecolors="none", edgecolors=color, s=90, linewidths=1.4,
                           zorder=2, label=f"preset, {scheduling}")
        values = [v for p in points if p[3] == metric for v in (p[4], p[5]) if v is not None]
        low, high = min(values), max(values)
        if metric.endswith("_rate"):
            margin = max((high - low) * 0.15, 0.005)
            ax.set_ylim(low - margin, high + margin)
        else:
            ax.set_ylim(0 if low >= 0 else low * 1.15, max(high * 1.15, high + 1))
        ax.set_xticks(range(len(releases)), releases, rotation=45, fontsize=8)
        ax.set_xlim(-0.5, len(releases) - 0.5)
        ax.set_title(metric, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[len(drawn):-1]:
        ax.set_visible(False)
    # The legend lives in the spare panel, so it never covers data and every chart has one.
    key = axes[-1]
    key.axis("off")
    handles = [Line2D([], [], linestyle="none", marker="o", markersize=size, label=f"{who}, {scheduling}",
                      markerfacecolor=color if filled else "none", markeredgecolor=color)
               for scheduling, color in SCHEDULING_COLORS.items()
               for who, filled, size in (("release", True, 6), ("preset", False, 9))]
    key.legend(handles=handles, loc="upper left", fontsize=8, frameon=False)
    key.text(0, 0.3, "filled: the release's stock connector\nhollow: the simulator with its preset\n"
             "a release without a marker: not run\n(see the table) or not measurable", fontsize=9,
             va="center", transform=key.transAxes)
    title = f"vLLM releases: {workload}"
    if skipped:  # wrapped: the figure never grows wider than the page
        title += "\n" + "\n".join(textwrap.wrap("Not drawn: " + "; ".join(f"{metric} {why}"
                                                                         for metric, why in skipped.items()), 150))
    fig.suptitle(title, fontsize=11)
    return fig
