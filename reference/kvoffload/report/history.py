"""(d) asv history: every tracked benchmark across commits, every machine in the same panel.

One figure per benchmark class (``bench_workloads.TrackMultiTurn``), one panel per benchmark
(``track_last_block_miss_rate``), one line per connector (or parameter set) and machine. The
reference is drawn last and thicker, so a reference regression is never hidden under a preset's
line. Colours: one hue per connector, a lighter shade and another line style per further machine;
the legend sits outside the panels, to the right. Values are shown in human units (bytes as MiB,
seconds as ms or µs) without an axis offset. Each figure lists the provenance of its points:
machine, commit, commit date, environment and asv result file.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from matplotlib import colormaps
from matplotlib.figure import Figure

from kvoffload.report.figures import REFERENCE_COLOR, Chart, label_order, slug
from kvoffload.report.sources import AsvPoint

_TAB20 = colormaps["tab20"].colors
# tab20 pairs (dark, light): green for the reference (the ablation's colour family), then
# blue, purple, brown, cyan, pink, olive, grey for presets and other parameter sets.
_HUES = (2, 0, 4, 5, 9, 6, 8, 7, 1, 3)  # pair indices; pair 2 (green) is the reference's
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")
PANEL_COLUMNS = 4


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
    """Colour, line style, marker, width and z-order of one line."""
    pair = 2 if is_reference else _HUES[1 + connector_index % (len(_HUES) - 1)]
    color = _TAB20[2 * pair + machine_index % 2]
    if is_reference and machine_index == 0:
        color = REFERENCE_COLOR
    return {"color": color, "linestyle": _LINESTYLES[machine_index % len(_LINESTYLES)],
            "marker": _MARKERS[machine_index % len(_MARKERS)], "markersize": 4 if is_reference else 3,
            "linewidth": 2.4 if is_reference else 1.3, "zorder": 4 if is_reference else 2}


def draw_asv_history(points: Sequence[AsvPoint], units: dict[str, str], out: Path,
                     param_names: dict[str, list[str]] | None = None) -> list[Chart]:
    by_owner: dict[str, list[AsvPoint]] = defaultdict(list)
    for point in points:
        by_owner[point.benchmark.rsplit(".", 1)[0]].append(point)
    return [_draw_owner(owner, group, units, out, param_names or {}) for owner, group in sorted(by_owner.items())]


def _draw_owner(owner: str, group: list[AsvPoint], units: dict[str, str], out: Path,
                param_names: dict[str, list[str]]) -> Chart:
    commits = sorted({(p.date, p.commit) for p in group})
    position = {commit: i for i, (_, commit) in enumerate(commits)}
    names = sorted({p.benchmark for p in group})
    machines = sorted({p.machine for p in group})
    envs = sorted({p.env for p in group})
    param_sets = _ordered_params({p.params for p in group})
    columns = min(PANEL_COLUMNS, len(names))
    rows = -(-len(names) // columns)
    width = max(9.0, 3.9 * columns + 2.6)  # + room for the legend on the right
    fig = Figure(figsize=(width, 3.0 * rows + 1.2), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    legend: dict[str, object] = {}
    for ax, name in zip(axes, names):
        lines: dict[tuple, list[AsvPoint]] = defaultdict(list)
        for p in group:
            if p.benchmark == name:
                lines[(p.machine, p.env, p.params)].append(p)
        unit = units.get(name, "")
        factor, shown_unit = human_unit(unit, [p.value for line in lines.values() for p in line])
        for (machine, env, params), line in sorted(lines.items(), key=lambda item: _is_reference(item[0][2])):
            line.sort(key=lambda p: position[p.commit])
            label = ", ".join(params) or name.rsplit(".", 1)[1]
            if len(machines) > 1:
                label += f" @ {machine}"
            if len(envs) > 1:
                label += f" [{env}]"
            style = series_style(param_sets.index(params), machines.index(machine), _is_reference(params))
            handle, = ax.plot([position[p.commit] for p in line], [p.value * factor for p in line],
                              label=label, **style)
            legend.setdefault(label, handle)
        metric = name.rsplit(".", 1)[1].removeprefix("track_")
        ax.set_title(f"{metric}\n({shown_unit}, lower is better)", fontsize=9, wrap=True)
        values = [p.value * factor for line in lines.values() for p in line]
        if values and min(values) >= 0:  # counts and rates start at 0; an all-zero panel is not +-0.04
            ax.set_ylim(bottom=0, top=None if max(values) > 0 else 1)
        ax.set_xticks(range(len(commits)), [c[:8] for _, c in commits], rotation=60, ha="right", fontsize=7)
        ax.set_xlim(-0.5, len(commits) - 0.5)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    ordered = sorted(legend, key=lambda label: (not label.startswith("reference"), label_key(label)))
    names_of_params = next((param_names[n] for n in names if param_names.get(n)), ["parameters"])
    fig.legend([legend[label] for label in ordered], ordered, loc="outside right upper", fontsize=8,
               title=", ".join(names_of_params) + (" @ machine" if len(machines) > 1 else ""), title_fontsize=8)
    fig.suptitle(f"asv history: {owner} ({', '.join(machines)})", fontsize=12, x=0.02, ha="left")
    filename = f"asv-{slug(owner)}.png"
    fig.savefig(out / filename, dpi=100)
    caption = (f"{len(names)} benchmarks across {len(commits)} commits (x axis: commits by commit date, "
               f"oldest left) on {len(machines)} machine(s): {', '.join(machines)}. asv tracks every value "
               "lower-is-better; a missing point is a commit where the benchmark failed or was not recorded.")
    return Chart("asv history", f"{owner}", filename, caption, provenance=_provenance(group))


def label_key(label: str):
    return label_order([label.split(" @ ")[0]])[0]


def _is_reference(params: tuple[str, ...]) -> bool:
    return "reference" in params


def _ordered_params(param_sets) -> list[tuple[str, ...]]:
    """Connector parameter sets in the ablation's order (reference first), others sorted."""
    return sorted(param_sets, key=lambda params: (0, label_order(params)) if params else (1, []))


def _provenance(group: list[AsvPoint]) -> tuple[tuple[str, ...], ...]:
    rows: dict[tuple[str, str], tuple[str, ...]] = {}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for p in group:
        counts[(p.machine, p.commit)] += 1
        date = datetime.datetime.fromtimestamp(p.date / 1000, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        rows[(p.machine, p.commit)] = (p.machine, p.commit[:12], date, p.env, p.result_file)
    header = ("machine", "commit", "commit date (UTC)", "environment", "asv result file", "points")
    body = sorted((row + (str(counts[key]),) for key, row in rows.items()), key=lambda r: (r[0], r[2]))
    return (header, *body)
