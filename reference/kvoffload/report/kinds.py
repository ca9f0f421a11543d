"""The three kinds of tracked number, read from a track's unit (asv's benchmarks.json): one owner
for the report's newest-commit view (``moves``) and its history charts (``history_marks``).

- deterministic: counts, rates, delays in steps, the modelled s/token: the same commit gives the
  same value on every machine and replay;
- counted: CPU instructions under callgrind (``benchmarks/bench_counts.py``): load does not move
  them, the machine's software may;
- wall time: µs, seconds, bytes, a real model's ms: load moves them too.
"""

from __future__ import annotations

DETERMINISTIC, COUNTED, WALL_TIME = "deterministic", "counted", "wall time"
MEASURED_UNITS = frozenset({"µs/step", "s/request", "seconds", "bytes"})


def track_kind(unit: str) -> str:
    """deterministic, counted or wall time, from a track's unit."""
    if unit.startswith("instructions"):
        return COUNTED
    if unit in MEASURED_UNITS or "(measured)" in unit:
        return WALL_TIME
    return DETERMINISTIC
