"""Charts from result files only: the report never runs a simulation.

Public API::

    draw_report(source, out) -> Path   # PNGs + index.html + index.md into ``out``; returns index.html

Reads, under ``source`` (``kvoffload report --from``, default ``results/``):

- run results: every ``*.json`` of the run schema, at any depth (``kvoffload run`` / ``bench``);
- asv results: ``asv/<machine>/*.json`` and ``asv/benchmarks.json``.

Draws (one function per kind; ``figures`` holds what they share):

(a) the fix ablation per workload (module ``ablation``): reference vs each fix off vs each vLLM
    preset, one panel per metric of ``ablation.ABLATION_METRICS`` that is not n/a (or 0 where it
    must be 0) for every run;
(b) hit rate against CPU capacity, from runs that differ only in ``config.cpu_chunks``;
(c) store submission / visibility delays per run, as its difference from the reference's (module
    ``delays``): the whole distributions where the result files keep them (``distributions``),
    else their p50 and p99;
(d) each asv benchmark across main's commits, every machine in the same panel (module
    ``history``), with the intended changes of ``changes.csv`` marked.

The page has one section per question a reader brings (``figures.SECTIONS``). Every chart lists
the provenance of its points (result files, commits, machines), and its data is a CSV beside it
(same name, ``.csv``).

Sections without data are listed under "Not drawn" with the reason. Figures of earlier reports
in ``out`` (our file-name patterns only) that this one did not redraw are removed at the end, so
the folder matches its index.
Every file is written whole or not at all (``results.atomic_output``); only regular files are
replaced or removed: ``report_outputs`` names the existing ones, for the command line to check
before any work, and the writer checks each again.

Every input is read and checked before the first file is written (``read_inputs``): a source the
report cannot draw from leaves ``out`` as it was, not created and not half redrawn. Two reports
into one folder take turns (a lock on it), and the temporary files of a report killed by SIGKILL
are removed by the next one (``results.remove_left_overs``). A file name is derived from a
workload's or benchmark's name one to one (``figures.slug``): two workloads never share a chart.
"""

from __future__ import annotations

import csv
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from kvoffload.report.ablation import draw_ablation
from kvoffload.report.changes import read_changes
from kvoffload.report.delays import draw_store_delays
from kvoffload.report.figures import FILE_PATTERNS, Chart, draw_capacity
from kvoffload.report.history import draw_asv_history
from kvoffload.report.moves import latest_moves
from kvoffload.report.page import Page, write_html, write_markdown
from kvoffload.report.releases import FILE_PATTERNS as RELEASE_PATTERNS
from kvoffload.report.releases import draw_releases, read_release_table
from kvoffload.report.sources import (
    asv_param_names,
    check_one_axis,
    check_source,
    find_asv_points,
    find_runs,
    read_asv_suite,
    read_main_line,
)
from kvoffload.results import ResultError, atomic_output, locked_folder, remove_left_overs

INDEX_FILES = ("index.html", "index.md")
# The names a report writes start so: the temporary files of a killed report are found by them.
WRITTEN_PREFIXES = (*INDEX_FILES, *(pattern.split("*")[0] for pattern in (*FILE_PATTERNS, *RELEASE_PATTERNS)))


def report_outputs(out: Path) -> list[Path]:
    """The files already in ``out`` that a report would replace or remove (its index pages and
    every file of its name patterns), for a caller to check before drawing."""
    if not out.is_dir():
        return []
    found = [out / name for name in INDEX_FILES if os.path.lexists(out / name)]
    return found + sorted({path for pattern in FILE_PATTERNS for path in out.glob(pattern)})


def _earlier_figures(out: Path) -> dict[Path, int]:
    """The files of our name patterns in ``out`` (an earlier report's), each with its inode:
    one this report replaces gets a new one (``atomic_output`` renames a new file over it)."""
    found = {}
    for pattern in (*FILE_PATTERNS, *RELEASE_PATTERNS):
        for path in out.glob(pattern):
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{path}: not a regular file; refusing to remove it")
            found[path] = info.st_ino
    return found


def _remove_stale(earlier: dict[Path, int]) -> None:
    """Remove the earlier report's files this one did not redraw. At the end, not the start: a
    report interrupted halfway leaves every file whole, old or new, none missing (the fault
    trials of issue 31: an interrupted `publish --charts` deleted 22 tracked charts)."""
    for path, inode in earlier.items():
        try:
            if os.lstat(path).st_ino == inode:
                path.unlink()
        except FileNotFoundError:
            pass


def write_data(chart: Chart, out: Path) -> None:
    """The chart's data as ``<figure>.csv`` beside it."""
    if chart.table:
        with atomic_output(out / chart.data_file, "w") as handle:
            csv.writer(handle, lineterminator="\n").writerows(chart.table)


@dataclass
class Inputs:
    """Everything a report draws from, read and checked (``read_inputs``)."""

    runs: list = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    points: list = field(default_factory=list)
    units: dict = field(default_factory=dict)
    param_names: dict = field(default_factory=dict)
    main_line: list = field(default_factory=list)
    changes: list = field(default_factory=list)


def read_inputs(source: Path) -> Inputs:
    """Every file under ``source`` the report reads, checked: ResultError (one line, naming the
    file) before anything is written. The release table is checked here and read again where it
    is drawn."""
    check_source(source)
    runs, ignored = find_runs(source)
    check_one_axis(runs)  # runs of two commits never share a chart
    points, units = find_asv_points(source / "asv")
    if not runs and not points and ignored:  # the one thing to say: why the results were not read
        raise ResultError(f"{source}: no readable result files ({len(ignored)} ignored; the first: {ignored[0]})")
    if not runs and not points:
        raise ResultError(f"{source}: no result files (expected kvoffload run results, *.json at any depth, "
                          f"or asv results under {source / 'asv'}/<machine>/)")
    read_release_table(source)
    inputs = Inputs(runs, ignored, points, units)
    if points:
        inputs.param_names = asv_param_names(read_asv_suite(source / "asv"))
        inputs.main_line, inputs.changes = read_main_line(source / "asv"), read_changes()
    return inputs


def draw_report(source: Path, out: Path) -> Path:
    """Draw every figure the result files under ``source`` support into ``out``; return index.html.

    Raises ResultError (one line, naming ``source``) when it is missing or holds no result files.
    """
    source, out = Path(source), Path(out)
    inputs = read_inputs(source)
    out.mkdir(parents=True, exist_ok=True)
    with locked_folder(out):  # another report into this folder would remove what this one writes
        remove_left_overs(out, WRITTEN_PREFIXES, prefix=True)
        earlier = _earlier_figures(out)
        index = _draw(source, inputs, out)
        _remove_stale(earlier)
        return index


def _draw(source: Path, inputs: Inputs, out: Path) -> Path:
    runs, points, units = inputs.runs, inputs.points, inputs.units
    page = Page(source=source, runs=runs, ignored=inputs.ignored)
    if runs:
        page.charts += draw_ablation(runs, out)
        capacity = draw_capacity(runs, out)
        if not capacity:
            page.notes.append("hit rate against CPU capacity: no runs that differ only in config.cpu_chunks "
                              "(make some with: kvoffload run --workload NAME --set cpu_chunks=N, for a few N)")
        page.charts += capacity
        page.charts += draw_store_delays(runs, out)
    else:
        page.notes.append("fix ablation, capacity and store delays: no run results (kvoffload bench writes them)")
    if points:
        page.charts += draw_asv_history(points, units, out, inputs.param_names, inputs.main_line, inputs.changes)
        page.moves = latest_moves(points, units, inputs.main_line, inputs.changes)
    else:
        page.notes.append(f"asv history: no asv results under {source / 'asv'}; the published history of main "
                          "is drawn by kvoffload report --from results (benchmarks/record adds to it)")

    releases, missing = draw_releases(source, out)  # results/releases/releases.json (kvoffload releases)
    page.charts += releases
    page.notes += [missing] if missing else []
    for chart in page.charts:
        write_data(chart, out)
    index = out / "index.html"
    write_html(page, index)
    write_markdown(page, out / "index.md")
    return index


__all__ = ["draw_report", "report_outputs"]
