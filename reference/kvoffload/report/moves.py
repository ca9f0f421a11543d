"""Did the newest commit regress? Each asv number at main's newest recorded commit against the same
number at the commit recorded before it, on the same machine: what moved, by how much, which way.

Every asv track is lower-is-better (``benchmarks/README.md``), so a number that went up is worse.
Three kinds of number (``kinds.track_kind``, read from the track's unit), three rules:

- **deterministic** (counts, rates, delays in steps, the modelled s/token): they move only when the
  code or a definition changed, so every move is listed, first, worse ones first (the page
  highlights them), with the intended changes of ``changes.csv`` at the newest commit named;
- **counted** (instructions under callgrind, ``bench_counts``): load does not move them, the same
  commit repeats within ``COUNT_NOISE``; a move beyond ``COUNT_BOUND`` is listed;
- **wall time** (µs, seconds, bytes, a real model's ms): load moves them too. A move is listed only
  when it passes its noise bound: both points have asv's quartiles of repeated samples, the
  quartile ranges do not overlap, and the median moved by more than the series' own history
  moves from one recorded commit to the next (``history_noise``: its 90th percentile, at least
  ``WALL_FLOOR``), so a runner shared with other jobs is held to the noise it has shown. The rest
  fold into one line (how many, and their range), so load never buries a real move.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

from kvoffload.report.changes import Change
from kvoffload.report.history import Axis
from kvoffload.report.kinds import COUNTED, DETERMINISTIC, WALL_TIME, track_kind
from kvoffload.report.sources import AsvPoint, MainCommit

RELATIVE_NOISE = 1e-9  # float noise: a deterministic number that moved less has not moved
COUNT_NOISE = 0.01  # the same commit's instruction count repeats within this, at any load (bench_counts)
COUNT_BOUND = 0.03  # two counts within COUNT_NOISE each differ by at most ~2 %: beyond 3 % is the code
WALL_FLOOR = 0.10  # a wall-time median that moved less is within what a shared runner's load does
HISTORY_PAIRS = 5  # recorded steps a series needs before its own history sets its noise bound
HEADER_KINDS = {DETERMINISTIC: 0, COUNTED: 1, WALL_TIME: 2}


def history_noise(values: Sequence[float]) -> float:
    """A wall-time series' own commit-to-commit noise: the 90th percentile of the relative step
    between consecutive recorded commits (as a factor - 1), WALL_FLOOR when it has under
    HISTORY_PAIRS steps or moves less than that."""
    steps = sorted(abs(math.log(b / a)) for a, b in zip(values, values[1:]) if a > 0 and b > 0)
    if len(steps) < HISTORY_PAIRS:
        return WALL_FLOOR
    return max(WALL_FLOOR, math.exp(steps[int(0.9 * (len(steps) - 1))]) - 1)


def passes_noise_bound(kind: str, old: AsvPoint, new: AsvPoint, noise: float = WALL_FLOOR) -> bool:
    """Whether a move of ``kind`` from ``old`` to ``new`` is beyond what noise does (module docstring);
    ``noise``: the series' own history_noise."""
    if kind == DETERMINISTIC:
        return abs(new.value - old.value) > RELATIVE_NOISE * max(abs(old.value), abs(new.value))
    relative = abs(new.value - old.value) / abs(old.value) if old.value else float("inf")
    if kind == COUNTED:
        return relative > COUNT_BOUND
    if old.spread is None or new.spread is None or old.samples < 2 or new.samples < 2:
        return False  # one sample: no noise measured, so no move can be told from it
    apart = new.spread[0] > old.spread[1] or new.spread[1] < old.spread[0]
    factor = max(new.value, old.value) / min(new.value, old.value) if min(new.value, old.value) > 0 else math.inf
    return apart and factor - 1 > noise


def latest_moves(points: Sequence[AsvPoint], units: dict[str, str], main_line: Sequence[MainCommit],
                 changes: Sequence[Change] = ()) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """(a sentence naming the two commits, a table: header then one row per number that moved,
    deterministic first and worse first, the wall-time numbers within their noise folded into one
    row). The last column is the verdict; a row whose verdict starts with "worse" is a regression."""
    axis = Axis.build(points, main_line)
    position = axis.position()
    series: dict[tuple[str, str, str, tuple[str, ...]], dict[int, AsvPoint]] = defaultdict(dict)
    for p in points:
        if p.commit in position:
            series[(p.machine, p.hardware, p.benchmark, p.params)][position[p.commit]] = p
    recorded = sorted({at for line in series.values() for at in line})
    if len(recorded) < 2:
        return "fewer than two recorded commits on main's line: nothing to compare", ()
    newest, before = recorded[-1], recorded[-2]
    header = ("kind", "benchmark", "parameters", "machine", f"{axis.commits[before].commit[:8]}",
              f"{axis.commits[newest].commit[:8]}", "change", "verdict")
    listed, folded, compared = [], [], 0
    for (machine, _, benchmark, params), line in sorted(series.items()):
        if newest not in line or before not in line:
            continue
        compared += 1
        old, new = line[before], line[newest]
        kind = track_kind(units.get(benchmark, ""))
        if new.value == old.value or (kind == DETERMINISTIC and not passes_noise_bound(kind, old, new)):
            continue
        change = (new.value - old.value) / old.value if old.value else None
        shown = f"{change * 100:+.3g}%" if change is not None else f"{new.value - old.value:+g}"  # +0.0273%
        earlier = [line[at].value for at in sorted(line) if at <= before]
        if kind == WALL_TIME and not passes_noise_bound(kind, old, new, history_noise(earlier)):
            folded.append(change)
            continue
        if kind == COUNTED and not passes_noise_bound(kind, old, new):
            continue  # within the count's own repeatability
        verdict = ("worse" if new.value > old.value else "better") + {
            DETERMINISTIC: "", COUNTED: f" (beyond the count's {COUNT_BOUND:.0%} bound)",
            WALL_TIME: " (beyond its noise: quartiles apart, a step its history has not made)"}[kind]
        label = kind if kind != WALL_TIME else f"wall time, median of {new.samples}"
        listed.append((HEADER_KINDS[kind], not verdict.startswith("worse"),
                       (label, benchmark.split(".", 1)[-1], " ".join(params), machine, f"{old.value:g}",
                        f"{new.value:g}", shown, verdict)))
    rows = [row for *_, row in sorted(listed, key=lambda item: item[:2])]
    if folded:
        known = [c for c in folded if c is not None]
        spread = f"{min(known):+.0%} to {max(known):+.0%}" if known else "-"
        rows.append(("wall time", f"{len(folded)} numbers", "", "", "", "", spread,
                     "within their noise (quartiles overlap, one sample, or a step "
                     "their own history makes): folded"))
    deterministic = sum(row[0] == DETERMINISTIC for row in rows)
    worse = sum(row[-1].startswith("worse") for row in rows)
    intended = [c for c in changes if axis.commits[newest].commit.startswith(c.commit)]
    sentence = (f"main's newest recorded commit {axis.commits[newest].commit[:8]} ({axis.commits[newest].date[:10]}) "
                f"against the one recorded before it, {axis.commits[before].commit[:8]}: {compared} number(s) recorded "
                f"at both; {deterministic} deterministic moved, {worse} worse"
                + (f"; {len(folded)} wall-time number(s) within their noise" if folded else "")
                + (f"; {newest - before - 1} commit(s) between them have no result" if newest - before > 1 else "")
                + ("; intended changes at the newest commit: " + "; ".join(c.reason for c in intended)
                   if intended else "")
                + ". Every number is lower-is-better: up is worse.")
    return sentence, (header, *rows) if rows else ()
