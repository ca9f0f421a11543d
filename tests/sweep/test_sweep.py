"""``kvoffload sweep``: a grid over local processes gives exactly the results of serial runs.

The story: a user sweeps the CPU tier size over two workloads and two connectors with two
processes. Every cell writes its own result file, and each file matches, metric for metric
(wall-clock timings aside), the file of the same cell replayed alone in this process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.metrics import MEASURED_METRICS
from kvoffload.sweep import Cell, comparable, plan_grid, run_grid, shard
from kvoffload.workloads import load_workload

WORKLOADS = ("multi-turn-small", "shared-prefix-small")
PRESETS = (None, "vllm-0.25")
GRID = (("cpu_chunks", ("64", "50%")),)


@pytest.fixture(scope="module")
def parallel_sweep(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("parallel")
    cells = plan_grid(WORKLOADS, PRESETS, GRID, fixed=(("max_num_seqs", "8"),))
    done = run_grid(cells, out_dir, jobs=2)
    return cells, done


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_grid_is_every_combination_in_a_stable_order():
    cells = plan_grid(WORKLOADS, PRESETS, GRID)
    assert len(cells) == 8
    assert cells[0] == Cell("multi-turn-small", None, (("cpu_chunks", "64"),))
    assert cells[1] == Cell("multi-turn-small", None, (("cpu_chunks", "50%"),))
    assert cells[-1] == Cell("shared-prefix-small", "vllm-0.25", (("cpu_chunks", "50%"),))
    assert len({cell.file_name() for cell in cells}) == 8
    assert Cell("w", None, (("cpu_chunks", "50"),)).file_name() != Cell("w", None, (("cpu_chunks", "50%"),)).file_name()


def test_shards_of_a_job_array_cover_the_grid_once():
    cells = plan_grid(WORKLOADS, PRESETS, GRID)
    shards = [shard(cells, index, 3) for index in range(3)]
    flat = [cell for part in shards for cell in part]
    assert len(flat) == len(cells) and set(flat) == set(cells)


def test_every_cell_of_a_parallel_sweep_matches_the_same_run_done_alone(parallel_sweep):
    cells, done = parallel_sweep
    assert [cell for cell, _, _ in done] == cells
    for cell, path, failed in done:
        assert not failed
        alone = replay_workload(load_workload(cell.workload, dict(cell.settings)),
                                ConnectorChoice.build(cell.preset))
        assert comparable(_read(path)) == comparable(json.loads(json.dumps(alone.result))), cell


def test_a_serial_sweep_writes_the_same_files_as_the_parallel_one(parallel_sweep, tmp_path):
    cells, done = parallel_sweep
    serial = run_grid(cells, tmp_path, jobs=1)
    for (cell, parallel_path, _), (_, serial_path, _) in zip(done, serial, strict=True):
        assert parallel_path.name == serial_path.name
        assert comparable(_read(parallel_path)) == comparable(_read(serial_path)), cell


def test_the_comparison_ignores_only_wall_clock_metrics(parallel_sweep):
    """Cells that differ in a setting differ in what the comparison keeps."""
    _, done = parallel_sweep
    small_tier, share_tier = _read(done[0][1]), _read(done[1][1])
    assert comparable(small_tier) != comparable(share_tier)
    dropped = set(small_tier["metrics"]) - set(comparable(small_tier)["metrics"])
    assert dropped == MEASURED_METRICS & set(small_tier["metrics"])  # the glossary's *measured* rows only
    assert {"connector_us_per_step", "copy_gb_per_s", "sim_requests_per_s"} <= dropped


def test_the_command_runs_a_grid_and_lists_one_file_per_cell(tmp_path, capsys):
    """(In this process, one job: the parallel path is the fixture's.)"""
    code = main(["sweep", "--workload", "multi-turn-small", "--preset", "reference", "--preset", "vllm-0.30",
                 "--grid", "blocks_per_chunk=1,2", "--quiet", "--out-dir", str(tmp_path)])
    assert code == 0
    files = sorted(path.name for path in tmp_path.glob("sweep-*.json"))
    assert len(files) == 4 and "sweep-multi-turn-small-vllm-0.30-blocks_per_chunk=2.json" in files
    assert capsys.readouterr().out.count(" -> ") == 4


@pytest.mark.parametrize("args, message", [
    (["--preset", "vllm-9"], "unknown preset"),
    (["--grid", "cpu_chunks=64,64"], "two cells would write"),
    (["--grid", "cpu_chunks=64,lots"], "--set cpu_chunks=lots: expected a chunk count"),
    (["--grid", "gpu_memory=1,2"], "unknown setting 'gpu_memory'"),
    (["--set", "cpu_chunks=64", "--grid", "cpu_chunks=1,2"], "given twice across --set and --grid"),
    (["--shard", "3/3"], "--shard expects K/N with 0 <= K < N"),
    (["--jobs", "0"], "--jobs expects at least 1"),
    # issue 22: found by the cell that reached it, after the cells before it had replayed
    (["--grid", "gpu_blocks=256,12"], "sweep cell multi-turn-small [reference] gpu_blocks=12: "
     "workloads/multi-turn-small.toml: request c0-t03: expected prompt + output within max_model_len 176"),
    (["--workload", "nope"], "sweep cell nope [reference]: nope: unknown workload"),
    (["--preset", "reference", "--preset", "vllm-0.30", "--grid", "cpu_chunks=64,1e999GiB"],
     "--set cpu_chunks=1e999GiB: expected a size a float holds"),
    (["--set", "cpu_chunks=1e999GiB"], "--set cpu_chunks=1e999GiB: expected a size a float holds"),
    (["--grid", "seed=1," + "9" * 5000], "seed expects an integer of at most 4,300 digits, got 5,000 digits"),
    (["--grid", "seed=1," + "9" * 300], "json: its name is 343 bytes long; this file system takes at most 255"),
    (["--shard", "0/" + "9" * 5000], "--shard expects K/N with 0 <= K < N"),
])
def test_bad_sweeps_are_one_line_with_exit_2_and_nothing_written(tmp_path, capsys, args, message):
    code = main(["sweep", "--workload", "multi-turn-small", "--quiet", "--out-dir", str(tmp_path / "out"), *args])
    stderr = capsys.readouterr().err
    assert code == 2
    assert stderr.count("\n") == 1 and message in stderr, stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
