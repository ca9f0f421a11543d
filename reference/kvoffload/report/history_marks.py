"""What a history panel marks so that a move cannot hide (``report.history``).

- **Moves of a deterministic track** (``kinds.track_kind``): at every commit where a line's value differs
  from its previous recorded value, a large triangle in the line's colour (up: worse, every track
  being lower-is-better; down: better), drawn above every line, and once per commit and panel the
  commit's short id with an arrow at the top of the panel: a step is seen wherever it is, the
  newest commit's included, and whatever other lines sit at the same value.
- **Axes of measured tracks** (wall time, instruction counts): a log scale where the panel's values
  span more than ``LOG_SPAN``, so one outlier (a commit measured under heavy load) cannot flatten
  the rest of the line into the floor; the panel's title says so.
"""

from __future__ import annotations

import math
from typing import Sequence

from kvoffload.report.kinds import COUNTED, DETERMINISTIC, WALL_TIME

LOG_SPAN = 3.0  # largest / smallest value of a measured panel beyond which its y axis is logarithmic
UP_COLOR, DOWN_COLOR, BOTH_COLOR = "#c0392b", "#1e7b34", "#7b3294"


def moves_of(xs: Sequence[int], values: Sequence[float]) -> list[tuple[int, float, bool]]:
    """(slot, value, went up) for each recorded point whose value differs from the previous one."""
    found = []
    for i in range(1, len(xs)):
        before, now = values[i - 1], values[i]
        if not math.isclose(before, now, rel_tol=1e-9, abs_tol=1e-12):
            found.append((xs[i], now, now > before))
    return found


def mark_moves(ax, moves: dict[str, list[tuple[int, float, bool]]], colors: dict[str, str], commits,
               factor: float) -> list[int]:
    """Draw the moves of each line (label: its moves); return the slots marked, left to right."""
    ways: dict[int, set[bool]] = {}
    for label, found in moves.items():
        for slot, value, up in found:
            # not clipped: the newest commit's slot is at the panel's right edge
            ax.plot([slot], [value * factor], linestyle="none", marker="^" if up else "v", markersize=12,
                    color=colors[label], markeredgecolor="black", markeredgewidth=1.0, zorder=10, clip_on=False)
            ways.setdefault(slot, set()).add(up)
    last = len(commits) - 1
    for slot, seen in sorted(ways.items()):
        arrow, color = (("↑", UP_COLOR) if seen == {True} else ("↓", DOWN_COLOR) if seen == {False}
                        else ("↕", BOTH_COLOR))
        ax.annotate(f"{arrow}{commits[slot].commit[:7]}", (slot, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, -3), textcoords="offset points", rotation=90, ha="right" if slot == last else "center",
                    va="top", fontsize=7, color=color, zorder=11,
                    bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})
    return sorted(ways)


def measured_axis(ax, kind: str, values: Sequence[float]) -> str:
    """Set a measured panel's y scale; return what the title says about it ("" for linear)."""
    if kind == DETERMINISTIC:
        return ""
    positive = [v for v in values if v > 0]
    if positive and len(positive) == len(values) and max(positive) / min(positive) > LOG_SPAN:
        ax.set_yscale("log")
        return "log scale"
    return ""


def kind_words(kind: str) -> str:
    """How a panel's numbers were obtained, for its title (wall time is labelled as such everywhere)."""
    return {WALL_TIME: "wall time", COUNTED: "instructions counted, load-independent",
            DETERMINISTIC: "deterministic"}[kind]
