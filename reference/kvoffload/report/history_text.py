"""The words and tables around a history chart (``report.history``): its caption, the CSV of
its points and the provenance of each point."""

from __future__ import annotations

import datetime
from collections import defaultdict
from typing import Sequence

from kvoffload.report.changes import Change
from kvoffload.report.sources import AsvPoint


def one_sample(points: Sequence[AsvPoint]) -> bool:
    """True where no point has a spread measured: asv kept no statistics, or of one sample."""
    return not any(p.spread is not None and p.samples > 1 for p in points)


def caption(names, zero, axis, recorded, machines, marked: dict[Change, int], off_line: int) -> str:
    if axis.first_parent:
        parts = [f"{len(names)} benchmarks over main's first-parent line: {len(axis.commits)} commits that carry "
                 f"the suite, oldest left; {len(recorded & {c.commit for c in axis.commits})} have results "
                 f"(a grey tick under the axis marks each commit without one, a dotted line bridges it)"]
    else:
        parts = [f"{len(names)} benchmarks across {len(axis.commits)} recorded commits in commit-date order "
                 "(no first-parent list: commits without results are not shown)"]
    parts.append(f"machines: {', '.join(machines)}; every value lower-is-better")
    if marked:
        parts.append("intended changes (dashed lines): " + "; ".join(
            f"#{n} {change.commit} ({change.metric}): {change.reason}"
            for change, n in sorted(marked.items(), key=lambda item: item[1])))
    if zero:
        parts.append("0 on every recorded commit, connector and machine, so not drawn: "
                     + ", ".join(name.rsplit(".", 1)[1].removeprefix("track_") for name in zero))
    if off_line:
        parts.append(f"results of {off_line} commit(s) off main's first-parent line are left out")
    return ". ".join(parts) + "."


def spread_sentence(group: Sequence[AsvPoint], names: Sequence[str]) -> str:
    """Which panels show a spread (asv's quartiles of repeated samples) and which have one sample
    per commit, where no spread was measured."""
    single = [name for name in names if one_sample([p for p in group if p.benchmark == name])]
    spread = [name for name in names if name not in single]

    def listed(chosen: list[str]) -> str:
        return "every panel" if len(chosen) == len(names) else ", ".join(
            name.rsplit(".", 1)[1].removeprefix("track_") for name in chosen)

    parts = []
    if spread:
        parts.append(f"A bar at a point is asv's interquartile range of that commit's repeated samples "
                     f"({listed(spread)}).")
    if single:
        parts.append(f"One sample per commit, so no spread was measured ({listed(single)}).")
    return (" " + " ".join(parts)) if parts else ""


def overlaid_sentence(overlaid: dict[str, list[list[str]]]) -> str:
    if not overlaid:
        return ""
    return (" Lines with the same value at every commit they share, drawn over each other (each keeps its "
            "marker): "
            + "; ".join(f"{metric}: " + ", ".join(" = ".join(group) for group in groups)
                        for metric, groups in overlaid.items()) + ".")


def iso(date_ms: int) -> str:
    return datetime.datetime.fromtimestamp(date_ms / 1000, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M")


def table(group: list[AsvPoint], units: dict[str, str]) -> tuple[tuple[str, ...], ...]:
    """The chart's data, one row per point (the CSV beside the figure)."""
    header = ("benchmark", "parameters", "machine", "commit", "commit date (UTC)", "value", "unit", "q25", "q75",
              "samples", "spread")
    rows = sorted((p.benchmark, " ".join(p.params), p.machine, p.commit, iso(p.date), repr(p.value),
                   units.get(p.benchmark, ""), "" if p.spread is None else repr(p.spread[0]),
                   "" if p.spread is None else repr(p.spread[1]), str(p.samples),
                   "none measured: one sample" if one_sample([p]) else f"interquartile range of {p.samples} samples")
                  for p in group)
    return (header, *rows)


def provenance(group: list[AsvPoint]) -> tuple[tuple[str, ...], ...]:
    rows: dict[tuple[str, str], tuple[str, ...]] = {}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for p in group:
        counts[(p.machine, p.commit)] += 1
        rows[(p.machine, p.commit)] = (p.machine, p.commit[:12], iso(p.date).replace("T", " "), p.env,
                                       p.result_file)
    header = ("machine", "commit", "commit date (UTC)", "environment", "asv result file", "points")
    body = sorted((row + (str(counts[key]),) for key, row in rows.items()), key=lambda r: (r[0], r[2]))
    return (header, *body)


def marks_sentence(moved: Sequence[str], logged: Sequence[str]) -> str:
    """The caption's words for the move marks and the log-scaled panels (``history_marks``)."""
    parts = []
    if moved:
        parts.append("A large triangle marks each commit where a deterministic track moved (up: worse, down: "
                     "better), drawn above every line, and the commit's short id with its arrow stands at the top "
                     "of the panel: " + ", ".join(commit[:7] for commit in moved) + ".")
    if logged:
        parts.append("Wall-time and counted panels whose values span more than 3x use a log scale, so one "
                     "outlier cannot flatten the rest: " + ", ".join(logged) + ".")
    return (" " + " ".join(parts)) if parts else ""


def machines_sentence(machines: Sequence[str], split: Sequence[str]) -> str:
    """How the panels use the machines: wall time and counts per machine, deterministic tracks pooled."""
    if len(machines) < 2:
        return ""
    words = (" Wall-time and counted numbers are drawn one line per machine (never two machines on one line); "
             "a deterministic track's value belongs to the commit, not the machine, so its panels draw one line "
             "per connector from every machine's results")
    if split:
        words += (", except where two machines disagree at a commit (drawn per machine, a determinism bug to "
                  "look at): " + ", ".join(split))
    return words + "."
