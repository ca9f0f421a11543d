"""A grid of replays (workload x connector x ``--set`` values) over local processes.

Each cell is one ``kvoffload run``: it loads its workload with its settings, replays it and writes
its own result file. Cells share nothing, so running them in N processes gives the same result
files as running them one after another (apart from the measured wall-time metrics and the
provenance's timing-free fields, which are equal anyway). ``docs/performance.md`` ("Sweeps") shows
how the same grid spreads over several machines with a scheduler's job array (``--shard K/N``).

Processes are started with ``spawn``: a fresh interpreter per worker, no state inherited from the
parent (no forked torch thread pools, no copied RNG state), which is what makes a cell's result
independent of where and after what it ran.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from kvoffload import sweep_workers as workers
from kvoffload.metrics import MEASURED_METRICS
from kvoffload.results import write_atomic

# MEASURED_METRICS (the glossary's *measured* rows) time this process; every other metric is a
# function of the inputs.


@dataclass(frozen=True)
class Cell:
    """One point of the grid: a workload spec, a preset (None: the reference), ``--set`` pairs."""

    workload: str
    preset: str | None
    settings: tuple[tuple[str, str], ...]

    @property
    def connector_label(self) -> str:
        return self.preset or "reference"

    def file_name(self) -> str:
        parts = [self.workload, self.connector_label] + [f"{key}={value}" for key, value in self.settings]
        return "sweep-" + "-".join(_slug(part) for part in parts) + ".json"

    def describe(self) -> str:
        settings = " ".join(f"{key}={value}" for key, value in self.settings)
        return f"{self.workload} [{self.connector_label}]" + (f" {settings}" if settings else "")


def plan_grid(workloads: Sequence[str], presets: Sequence[str | None],
              grid: Sequence[tuple[str, Sequence[str]]], fixed: Sequence[tuple[str, str]] = ()) -> list[Cell]:
    """Every combination, workloads slowest-varying, grid keys in the order given."""
    keys = [key for key, _ in grid]
    cells = []
    for workload, preset, values in itertools.product(workloads, presets,
                                                      itertools.product(*(vals for _, vals in grid))):
        cells.append(Cell(workload, preset, tuple(fixed) + tuple(zip(keys, values))))
    return cells


def shard(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """Cells ``index``, ``index + count``, ... (0-based): one share of a job array's grid."""
    return list(cells[index::count])


def check_cells(cells: Sequence[Cell]) -> None:
    """Load the workload of every distinct (workload, settings) of ``cells`` and drop it: bad input
    anywhere in the grid (a workload, a value, a value that does not fit a workload) is found
    before the first replay, not by the cell that reaches it. Loading is a fraction of a second
    per cell (generation, or a trace's first pass), a replay seconds to minutes."""
    from kvoffload.workloads import WorkloadError, load_workload

    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for cell in cells:
        if (cell.workload, cell.settings) in seen:
            continue
        seen.add((cell.workload, cell.settings))
        try:
            load_workload(cell.workload, dict(cell.settings))
        except WorkloadError as error:
            raise WorkloadError(f"sweep cell {cell.describe()}: {error}") from None


def run_cell(cell: Cell, out_dir: Path) -> tuple[Path, bool]:
    """Replay one cell and write its result file; (path, failed). Runs in a worker process."""
    from kvoffload.choice import ConnectorChoice
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(cell.workload, dict(cell.settings))
    outcome = replay_workload(workload, ConnectorChoice.build(cell.preset))
    path = out_dir / cell.file_name()
    write_atomic(path, outcome.result)
    return path, outcome.failed


def run_grid(cells: Sequence[Cell], out_dir: Path, jobs: int,
             on_done: Callable[[Cell, Path, bool], None] = lambda cell, path, failed: None
             ) -> list[tuple[Cell, Path, bool]]:
    """Run ``cells`` over ``jobs`` processes (1: in this process, in order); results in grid order.

    The first cell that raises (bad input found while loading its workload) stops the sweep:
    cells not started are cancelled, the error propagates; files already written are complete.
    An interrupt (Ctrl-C) or any other error here stops the workers at once: each removes the
    temporary file of a result it was writing (``sweep_workers.py``), so no file is left half-written.
    """
    if jobs == 1:
        done = []
        for cell in cells:
            path, failed = run_cell(cell, out_dir)
            on_done(cell, path, failed)
            done.append((cell, path, failed))
        return done
    outcomes: dict[Cell, tuple[Path, bool]] = {}
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=workers.start,
                               initargs=(os.getpid(),))
    try:
        with workers.spawning():  # workers start deaf to Ctrl-C: this process handles it
            futures = {pool.submit(workers.run_in_worker, run_cell, cell, out_dir): cell for cell in cells}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                if future.exception() is not None:
                    raise future.exception()
                cell = futures[future]
                outcomes[cell] = future.result()
                on_done(cell, *outcomes[cell])
    except BaseException:
        workers.stop(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [(cell, *outcomes[cell]) for cell in cells]


def comparable(result: dict) -> dict:
    """A result file without what depends on the wall clock: for serial-vs-parallel equality."""
    metrics = {name: value for name, value in result["metrics"].items() if name not in MEASURED_METRICS}
    return {**{key: value for key, value in result.items() if key != "provenance"}, "metrics": metrics}


def duplicates(cells: Iterable[Cell]) -> list[str]:
    """File names two cells would both write (a value listed twice in the grid)."""
    seen: set[str] = set()
    twice = []
    for cell in cells:
        name = cell.file_name()
        if name in seen:
            twice.append(name)
        seen.add(name)
    return twice


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in ".=-" else "_" for c in text.replace("%", "pct")).strip("_")
