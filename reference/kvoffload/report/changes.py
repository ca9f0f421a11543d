"""Intended changes of a tracked number: one list, ``changes.csv`` beside this module.

Each row is a commit of main's first-parent line that changed what a track measures (its
definition) or the engine's rules that a track follows, on purpose: ``commit``, ``metric`` (asv
track names or globs such as ``store_*``, separated by spaces), ``version`` (the track's
version from that commit on, when the change bumped it; empty otherwise) and ``reason``. The
history charts draw each row as a marker on the panels it names, so a step there is read as the
change it is, not as a regression; ``benchmarks/record`` records a versioned track only for
commits that contain its row's commit.
"""

from __future__ import annotations

import csv
import fnmatch
from dataclasses import dataclass
from pathlib import Path

CHANGES_FILE = Path(__file__).with_name("changes.csv")


@dataclass(frozen=True)
class Change:
    commit: str  # abbreviated id of main's first-parent commit that brought the change
    metric: str  # globs over asv track names (the part after ``track_``), separated by spaces
    version: str  # the track's version from this commit on; "" when it kept its version
    reason: str

    def applies_to(self, track: str) -> bool:
        return any(fnmatch.fnmatchcase(track, glob) for glob in self.metric.split())


def read_changes(path: Path = CHANGES_FILE) -> list[Change]:
    with open(path, newline="", encoding="utf-8") as handle:
        return [Change(row["commit"].strip(), row["metric"].strip(), row["version"].strip(), row["reason"].strip())
                for row in csv.DictReader(handle)]
