"""(d) asv history: every tracked benchmark across main's commits, every machine in the same panel.

One figure per benchmark class (``bench_workloads.TrackMultiTurn``), one panel per benchmark
(``track_last_block_miss_rate``), one line per connector (or parameter set) and machine.

- x axis: main's first-parent line (``asv/first-parent.tsv``, written by ``benchmarks/record``),
  oldest left, one slot per commit: a commit without a result is a gap (the line breaks there,
  a dotted line bridges it, and a grey tick on the axis marks it); the two ends are labelled
  with their commit ids and dates; in the HTML page each commit's slot names the commit on hover.
  Without that file: the recorded commits in commit-date order (no gaps can be seen).
  Results of commits off main's first-parent line are left out and counted in the caption.
- spread: where asv kept statistics of repeated samples, a bar from the lower to the upper
  quartile at each point; where a panel's points are one sample each (a track's value, a real
  model's single measurement), the caption and the CSV say that no spread was measured.
- intended changes (``changes.csv``): a dashed vertical line, numbered, on the panels of the
  tracks they changed; the caption gives each one's commit and reason.
- tracks that were 0 on every recorded commit, connector and machine are listed once in the
  caption instead of being drawn as flat lines.
- a track the suite no longer has (absent from ``benchmarks.json``: renamed or moved, like the
  full replay's single-sample ``connector_us_per_step`` that the ``Measure*`` classes took over)
  keeps its points, and its panel and the caption say no newer point will join them.

The reference is drawn last and thicker, so a reference regression is never hidden under a
preset's line. Each connector has its own hue, marker and line style (the others' markers hollow
and larger, so markers at one value nest instead of hiding each other); a further machine a
lighter shade and the next line style. Lines with the same value at every commit they share are
named in their panel's title and the caption ("same at every shared commit: a = b"): one drawn
over the other is never taken for a missing line. The legend sits outside the panels, to the
right. Values are shown in human units (bytes as MiB, seconds as ms or µs) without an axis
offset. Each figure lists the provenance of its points: machine, commit, commit date,
environment and asv result file.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kvoffload.report.changes import Change
from kvoffload.report.figures import REFERENCE_COLOR, REGRESSION, Chart, HoverBox, label_order, save_figure, slug
from kvoffload.report import history_text as text
from kvoffload.report.history_marks import kind_words, mark_moves, measured_axis, moves_of
from kvoffload.report.kinds import DETERMINISTIC, track_kind
from kvoffload.report.sources import AsvPoint, MainCommit

_TAB20 = colormaps["tab20"].colors
# tab20 pairs (dark, light): green for the reference (the ablation's colour family), then
# blue, purple, brown, cyan, pink, olive, grey for presets and other parameter sets.
_HUES = (2, 0, 4, 5, 9, 6, 8, 7, 1, 3)  # pair indices; pair 2 (green) is the reference's
_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
PANEL_COLUMNS = 3
PANEL_SIZE = (3.6, 3.3)  # inches per panel: three and the legend fit figures.MAX_FIGURE_WIDTH_PX
CHANGE_COLOR = "#7b3294"
GAP_COLOR = "#bbbbbb"
DPI = 100


def human_unit(unit: str, values: Sequence[float]) -> tuple[float, str]:
    """(factor, label) that shows ``values`` of ``unit`` in human units: MiB/GiB, s/ms/µs."""
    top = max((abs(v) for v in values), default=0.0)
    if unit == "bytes":
        return (1 / 2**30, "GiB") if top >= 2**30 else (1 / 2**20, "MiB")
    if unit == "seconds":
        if top >= 1:
            return 1.0, "s"
        return (1e3, "ms") if top >= 1e-3 else (1e6, "µs")
    return 1.0, unit or "value"


def series_style(connector_index: int, machine_index: int, is_reference: bool) -> dict:
    """Colour, line style, marker, width and z-order of one line: a connector's own marker and line
    style, so lines drawn over each other still show each one's markers and dashes."""
    pair = 2 if is_reference else _HUES[1 + connector_index % (len(_HUES) - 1)]
    color = _TAB20[2 * pair + machine_index % 2]
    if is_reference and machine_index == 0:
        color = REFERENCE_COLOR
    return {"color": color, "linestyle": _LINESTYLES[(connector_index + machine_index) % len(_LINESTYLES)],
            "marker": _MARKERS[connector_index % len(_MARKERS)], "markersize": 4 if is_reference else 6,
            "markerfacecolor": color if is_reference else "none",
            "linewidth": 2.4 if is_reference else 1.3, "zorder": 4 if is_reference else 2}


@dataclass(frozen=True)
class Axis:
    """The x axis of every history figure: one slot per commit, oldest left."""

    commits: tuple[MainCommit, ...]
    first_parent: bool  # True: main's first-parent line (gaps visible); False: recorded commits by date

    @classmethod
    def build(cls, points: Sequence[AsvPoint], main_line: Sequence[MainCommit]) -> Axis:
        if main_line:
            return cls(tuple(main_line), True)
        seen = sorted({(p.date, p.commit) for p in points})
        return cls(tuple(MainCommit(commit, text.iso(date), "") for date, commit in seen), False)

    def position(self) -> dict[str, int]:
        return {c.commit: i for i, c in enumerate(self.commits)}

    def find(self, prefix: str) -> int | None:
        return next((i for i, c in enumerate(self.commits) if c.commit.startswith(prefix)), None)


def coinciding(series: dict[str, dict[int, float]]) -> list[list[str]]:
    """Groups of two or more lines (label: {commit slot: value}) with the same value at every
    commit both have (a preset added later joins at its first commit), in the order given: where
    they share commits, one is drawn over the other."""
    def same(a: dict[int, float], b: dict[int, float]) -> bool:
        shared = a.keys() & b.keys()
        return bool(shared) and all(math.isclose(a[x], b[x], rel_tol=1e-9, abs_tol=1e-12) for x in shared)

    groups: list[list[str]] = []
    for label, values in series.items():
        same_group = next((group for group in groups if same(series[group[0]], values)), None)
        if same_group is None:
            groups.append([label])
        else:
            same_group.append(label)
    return [group for group in groups if len(group) > 1]


def always_zero(points: Sequence[AsvPoint]) -> list[str]:
    """Benchmarks whose every value (each commit, parameter set and machine) is 0."""
    values: dict[str, set[float]] = defaultdict(set)
    for p in points:
        values[p.benchmark].add(p.value)
    return sorted(name for name, seen in values.items() if seen == {0.0})


def draw_asv_history(points: Sequence[AsvPoint], units: dict[str, str], out: Path,
                     param_names: dict[str, list[str]] | None = None, main_line: Sequence[MainCommit] = (),
                     changes: Sequence[Change] = ()) -> list[Chart]:
    axis = Axis.build(points, main_line)
    on_line = axis.position()
    off_line = {p.commit for p in points if p.commit not in on_line}
    by_owner: dict[str, list[AsvPoint]] = defaultdict(list)
    for point in points:
        if point.commit in on_line:
            by_owner[point.benchmark.rsplit(".", 1)[0]].append(point)
    return [_draw_owner(owner, group, units, out, param_names or {}, axis, changes, len(off_line))
            for owner, group in sorted(by_owner.items())]


def _draw_owner(owner: str, group: list[AsvPoint], units: dict[str, str], out: Path,
                param_names: dict[str, list[str]], axis: Axis, changes: Sequence[Change], off_line: int) -> Chart:
    position = axis.position()
    zero = always_zero(group)
    names = sorted({p.benchmark for p in group} - set(zero))
    recorded = {p.commit for p in group}
    if not names:  # every track of the class stayed 0: one line says so, no empty panels
        fig = Figure(figsize=(8, 1.2), dpi=DPI)
        fig.text(0.02, 0.5, f"asv history: {owner}: every benchmark was 0 on every recorded commit", fontsize=11)
        filename = f"asv-{slug(owner)}.png"
        save_figure(fig, out / filename, dpi=DPI)
        return Chart(REGRESSION, owner, filename, text.caption(names, zero, axis, recorded, [], {}, off_line),
                     provenance=text.provenance(group), table=text.table(group, units))
    hardware_of: dict[str, set[str]] = defaultdict(set)  # machine: the hardware its result files name
    for p in group:
        hardware_of[p.machine].add(p.hardware)
    machines = sorted({machine_label(p, hardware_of) for p in group})
    envs = sorted({p.env for p in group})
    param_sets = _ordered_params({p.params for p in group})
    columns = max(1, min(PANEL_COLUMNS, len(names)))
    rows = max(1, -(-len(names) // columns))
    fig = Figure(figsize=(PANEL_SIZE[0] * columns + 2.6, PANEL_SIZE[1] * rows + 1.3), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    legend: dict[str, object] = {}
    numbers = _numbered(changes, axis)
    marked: dict[Change, int] = {}  # the changes drawn on this figure, with their numbers
    overlaid: dict[str, list[list[str]]] = {}  # metric: groups of lines drawn over each other
    moved_at: set[int] = set()  # commit slots where a deterministic track moved, on any panel
    logged: list[str] = []  # measured panels drawn on a log scale
    split: list[str] = []  # deterministic panels whose machines disagree at a commit: a line per machine
    for ax, name in zip(axes, names):
        kind = panel_kind(name, units)
        ours = [p for p in group if p.benchmark == name]
        # A deterministic value belongs to the commit, not the machine: one line per connector from
        # every machine's results, where every commit recorded on two machines agrees (else per machine).
        pooled = kind == DETERMINISTIC and machines_agree(ours)
        lines: dict[tuple, dict[str, AsvPoint]] = defaultdict(dict)
        for p in ours:
            lines[(ANY_MACHINE if pooled else machine_label(p, hardware_of), p.env, p.params)][p.commit] = p
        if not pooled and kind == DETERMINISTIC:
            split.append(name.rsplit(".", 1)[1].removeprefix("track_"))
        lines = {key: list(by_commit.values()) for key, by_commit in lines.items()}
        factor, shown_unit = human_unit(units.get(name, ""), [p.value for line in lines.values() for p in line])
        series: dict[str, dict[int, float]] = {}
        moves: dict[str, list] = {}  # label: its moves (deterministic panels), colors: label: its colour
        colors: dict[str, str] = {}
        for (machine, env, params), line in sorted(lines.items(), key=lambda item: _is_reference(item[0][2])):
            line.sort(key=lambda p: position[p.commit])
            label = ", ".join(params) or name.rsplit(".", 1)[1]
            if len(machines) > 1 and machine != ANY_MACHINE:
                label += f" @ {machine}"
            if len(envs) > 1:
                label += f" [{env}]"
            style = series_style(param_sets.index(params), machines.index(machine) if machine in machines else 0,
                                 _is_reference(params))
            handle = _plot_line(ax, [position[p.commit] for p in line], line, factor, style, label)
            legend.setdefault(label, handle)
            series[label] = {position[p.commit]: p.value for p in line}
            if kind == DETERMINISTIC:
                moves[label] = moves_of([position[p.commit] for p in line], [p.value for p in line])
                colors[label] = style["color"]
        moved_at.update(mark_moves(ax, moves, colors, axis.commits, factor))
        metric = name.rsplit(".", 1)[1].removeprefix("track_")
        retired = "; no longer recorded" if units and name not in units else ""  # benchmarks.json lacks it
        same = [sorted(group, key=label_key) for group in coinciding(series)]
        if same:
            overlaid[metric] = same
        named = "".join("\n" + "\n".join(textwrap.wrap("same at every shared commit: " + " = ".join(group), 50))
                        for group in same)
        values = [p.value * factor for line in lines.values() for p in line]
        scale = measured_axis(ax, kind, values)
        if scale:
            logged.append(metric)
        elif values and min(values) >= 0:  # counts and rates start at 0; an all-zero panel is not +-0.04
            ax.set_ylim(bottom=0, top=None if max(values) > 0 else 1)
        words = ", ".join(filter(None, [shown_unit, kind_words(kind) if kind != DETERMINISTIC else "", scale]))
        about = "\n".join(textwrap.wrap(f"({words}, lower is better{retired})", 50))
        ax.set_title(f"{metric}\n{about}{named}", fontsize=9)
        for change, number in numbers.items():
            at = axis.find(change.commit)
            if change.applies_to(metric):
                marked[change] = number
                ax.axvline(at - 0.5, color=CHANGE_COLOR, linestyle="--", linewidth=1.0, zorder=1)
                ax.annotate(f"#{number}", (at - 0.5, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -9),
                            textcoords="offset points", fontsize=7, color=CHANGE_COLOR)
        _commit_axis(ax, axis, recorded)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    if legend:
        ordered = sorted(legend, key=lambda label: (not label.startswith("reference"), label_key(label)))
        names_of_params = next((param_names[n] for n in names if param_names.get(n)), ["parameters"])
        fig.legend([legend[label] for label in ordered], ordered, loc="outside right upper", fontsize=8,
                   title=", ".join(names_of_params) + (" @ machine" if len(machines) > 1 else ""),
                   title_fontsize=8)
    # One column leaves the title the width of one panel beside the key: the machine goes below.
    fig.suptitle(f"asv history: {owner}{chr(10) if columns == 1 else ' '}({', '.join(machines)})", fontsize=12,
                 x=0.02, ha="left")
    filename = f"asv-{slug(owner)}.png"
    hover = _hover_boxes(fig, axes[:len(names)], axis, recorded)
    save_figure(fig, out / filename, dpi=DPI)
    caption = text.caption(names, zero, axis, recorded, machines, marked, off_line)
    caption += text.spread_sentence(group, names) + text.overlaid_sentence(overlaid)
    caption += text.marks_sentence([axis.commits[at].commit for at in sorted(moved_at)], logged)
    caption += text.machines_sentence(machines, split)
    gone = [name.rsplit(".", 1)[1].removeprefix("track_") for name in names if units and name not in units]
    if gone:  # a renamed or moved track: its points are history, nothing new joins them
        caption += (f" No longer in the suite (asv's benchmarks.json), so no newer point will join them: "
                    f"{', '.join(gone)}.")
    return Chart(REGRESSION, owner, filename, caption,
                 provenance=text.provenance(group), table=text.table(group, units), hover=hover)


ANY_MACHINE = ""  # the machine of a pooled deterministic line: every machine's results


def panel_kind(name: str, units: dict[str, str]) -> str:
    """The kind of a benchmark's numbers (``kinds.track_kind``); a track the suite no longer has
    takes the unit of a current track of the same name (the Track* classes' single-sample
    connector_us_per_step is the Measure* classes' wall time)."""
    unit = units.get(name) or next((u for other, u in units.items()
                                    if other.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]), "")
    return track_kind(unit)


def machines_agree(points: Sequence[AsvPoint]) -> bool:
    """Whether every (parameters, commit) recorded on more than one machine has one value."""
    seen: dict[tuple, float] = {}
    for p in points:
        key = (p.env, p.params, p.commit)
        if key in seen and not math.isclose(seen[key], p.value, rel_tol=1e-9, abs_tol=1e-12):
            return False
        seen.setdefault(key, p.value)
    return True


def machine_label(point: AsvPoint, hardware_of: dict[str, set[str]]) -> str:
    """The machine a line belongs to: its name, and where the name's result files name more than one
    hardware (a folder appended to from two machines), the hardware too: never two on one line."""
    if len(hardware_of[point.machine]) < 2:
        return point.machine
    return f"{point.machine} [{point.hardware or 'hardware not recorded'}]"


def _numbered(changes: Sequence[Change], axis: Axis) -> dict[Change, int]:
    """The changes whose commit is on the axis, numbered from the oldest: the same number in
    every figure."""
    placed = sorted((at, i, change) for i, change in enumerate(changes) if (at := axis.find(change.commit)) is not None)
    return {change: n for n, (_, _, change) in enumerate(placed, 1)}


def _plot_line(ax, xs: list[int], line: list[AsvPoint], factor: float, style: dict, label: str):
    """Solid between neighbouring commits, dotted across a gap, a quartile bar where asv kept one."""
    ys = [p.value * factor for p in line]
    broken_x, broken_y = [], []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i and x != xs[i - 1] + 1:
            broken_x.append(x - 0.5)
            broken_y.append(math.nan)
        broken_x.append(x)
        broken_y.append(y)
    ax.plot(xs, ys, color=style["color"], linestyle=":", linewidth=0.8, alpha=0.6, zorder=style["zorder"] - 1)
    handle, = ax.plot(broken_x, broken_y, label=label, **style)
    spread = [(x, p.spread) for x, p in zip(xs, line) if p.spread is not None]
    if spread:
        ax.vlines([x for x, _ in spread], [lo * factor for _, (lo, _) in spread],
                  [hi * factor for _, (_, hi) in spread], color=style["color"], linewidth=3.0, alpha=0.35,
                  zorder=style["zorder"] - 1)
    return handle


def _commit_axis(ax, axis: Axis, recorded: set[str]) -> None:
    """Commit slots: the two ends labelled (id and date), a grey tick under each unrecorded commit."""
    last = len(axis.commits) - 1
    ends = [0, last] if last > 0 else [0]
    ax.set_xticks(ends, [f"{axis.commits[i].commit[:8]}\n{axis.commits[i].date[:10]}" for i in ends], fontsize=7)
    if last > 0:
        ax.get_xticklabels()[0].set_horizontalalignment("left")
        ax.get_xticklabels()[-1].set_horizontalalignment("right")
    ax.set_xlim(-0.5, last + 0.5)
    missing = [i for i, c in enumerate(axis.commits) if c.commit not in recorded]
    if missing:
        ax.plot(missing, [0.0] * len(missing), linestyle="none", marker="|", markersize=6, color=GAP_COLOR,
                transform=ax.get_xaxis_transform(), clip_on=False, zorder=1)
    if ax.get_yscale() == "linear":  # a log-scaled measured panel keeps its powers of ten
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(alpha=0.3)


def _hover_boxes(fig: Figure, axes, axis: Axis, recorded: set[str]) -> tuple[HoverBox, ...]:
    """One box per commit slot and panel column, in percent of the image: the page puts a tooltip
    (the commit's id, date and subject) on each, so a point names its commit on hover.

    Each box's edges are whole pixels of the image (the page draws it at its own size): a browser
    hit-tests a box by every whole pixel it touches, the later box on top, so with slots under two
    pixels wide and fractional edges the pointer over one commit named its neighbour (249 commits,
    1.86 px a slot: 248 of them). The left edge is nudged 1/256 px right: Chromium keeps a
    percentage in single precision and truncates it to 1/64 px, and an edge a hair below its
    pixel reached into the one before (the width needs none: a right edge a hair short still
    covers its last pixel)."""
    FigureCanvasAgg(fig).draw()  # lays out the panels as savefig will
    width, height = fig.bbox.width, fig.bbox.height
    boxes, columns_done = [], set()
    for ax in axes:
        box = ax.get_window_extent()
        column = round(box.x0)
        if column in columns_done:  # panels of a column share their x positions: one box spans them
            continue
        columns_done.add(column)
        top = max(a.get_window_extent().y1 for a in axes if round(a.get_window_extent().x0) == column)
        bottom = min(a.get_window_extent().y0 for a in axes if round(a.get_window_extent().x0) == column)
        for i, commit in enumerate(axis.commits):
            left = round(ax.transData.transform((i - 0.5, 0))[0])
            right = round(ax.transData.transform((i + 0.5, 0))[0])
            note = "" if commit.commit in recorded else " (not recorded)"
            title = f"{commit.commit[:12]} {commit.date[:16].replace('T', ' ')} {commit.subject[:100]}".strip() + note
            boxes.append(HoverBox(100 * (left + 1 / 256) / width, 100 * (height - top) / height, 100 * (right - left) / width,
                                  100 * (top - bottom) / height, title))
    return tuple(boxes)


def label_key(label: str):
    return label_order([label.split(" @ ")[0]])[0]


def _is_reference(params: tuple[str, ...]) -> bool:
    return "reference" in params


def _ordered_params(param_sets) -> list[tuple[str, ...]]:
    """Connector parameter sets in the ablation's order (reference first), others sorted."""
    return sorted(param_sets, key=lambda params: (0, label_order(params)) if params else (1, []))


