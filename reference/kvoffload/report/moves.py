"""Did the newest commit regress? Each asv number at main's newest recorded commit against the same
number at the commit recorded before it, on the same machine: what moved, by how much, which way.

Every asv track is lower-is-better (``benchmarks/README.md``), so a number that went up is worse.
Deterministic numbers move only when the code or a definition changed (a row of ``changes.csv``
at the newest commit says which); measured ones (times, µs, bytes) move with the machine's load
too, so they are marked as such, with asv's quartiles where it kept them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from kvoffload.report.changes import Change
from kvoffload.report.history import Axis
from kvoffload.report.sources import AsvPoint, MainCommit

MEASURED_UNITS = frozenset({"µs/step", "s/request", "seconds", "bytes"})
RELATIVE_NOISE = 1e-9  # float noise: a deterministic number that moved less has not moved


def latest_moves(points: Sequence[AsvPoint], units: dict[str, str], main_line: Sequence[MainCommit],
                 changes: Sequence[Change] = ()) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """(a sentence naming the two commits, a table: header then one row per number that moved)."""
    axis = Axis.build(points, main_line)
    position = axis.position()
    series: dict[tuple[str, str, tuple[str, ...]], dict[int, AsvPoint]] = defaultdict(dict)
    for p in points:
        if p.commit in position:
            series[(p.machine, p.benchmark, p.params)][position[p.commit]] = p
    recorded = sorted({at for line in series.values() for at in line})
    if len(recorded) < 2:
        return "fewer than two recorded commits on main's line: nothing to compare", ()
    newest, before = recorded[-1], recorded[-2]
    header = ("benchmark", "parameters", "machine", f"{axis.commits[before].commit[:8]}",
              f"{axis.commits[newest].commit[:8]}", "change", "verdict")
    rows, compared = [], 0
    for (machine, benchmark, params), line in sorted(series.items()):
        if newest not in line or before not in line:
            continue
        compared += 1
        old, new = line[before].value, line[newest].value
        if abs(new - old) <= RELATIVE_NOISE * max(abs(old), abs(new)):
            continue
        measured = units.get(benchmark, "") in MEASURED_UNITS
        change = f"{(new - old) / old:+.1%}" if old else f"{new - old:+g}"
        verdict = ("worse" if new > old else "better") + (" (measured: load moves it too)" if measured else "")
        rows.append((benchmark.split(".", 1)[-1], " ".join(params), machine, f"{old:g}", f"{new:g}", change, verdict))
    intended = [c for c in changes if axis.commits[newest].commit.startswith(c.commit)]
    sentence = (f"main's newest recorded commit {axis.commits[newest].commit[:8]} ({axis.commits[newest].date[:10]}) "
                f"against the one recorded before it, {axis.commits[before].commit[:8]}: {compared} number(s) recorded at "
                f"both, {len(rows)} moved"
                + (f"; {newest - before - 1} commit(s) between them have no result" if newest - before > 1 else "")
                + ("; intended changes at the newest commit: " + "; ".join(c.reason for c in intended)
                   if intended else "")
                + ". Every number is lower-is-better: up is worse.")
    return sentence, (header, *rows) if rows else ()
