"""Fuzzed command lines, in-process: every combination of flags, repeated flags, bad values and
hostile output paths either fails with one line (exit 2, nothing written) or passes validation.

Validation must be complete before any work: ``run`` and ``bench`` have their replay replaced by
a stub that stops the command, and the test checks that nothing was written up to that point (a
result can only be written after the replay). ``report`` has its drawing stubbed the same way,
``sweep`` its grid of replays (so every cell's workload is loaded with its values first).

Issue 22's categories: integers past 4,300 digits and sizes past a float in ``--set``/``--grid``,
outputs under /proc and /sys or with names too long, option-like values, sweeps whose bad cell
comes late in the grid. And the other direction: when validation passed, the result file can be
written where the command would write it (tried for real after the stub stopped it).
"""

from __future__ import annotations

import os
import shutil
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from fuzz_inputs import HUGE, INPUTS, fuzz_settings, mostly, texts
from hypothesis import given
from hypothesis import strategies as st

import kvoffload.cli.bench
import kvoffload.cli.run
import kvoffload.cli.sweep
import kvoffload.report
from kvoffload.cli import main
from kvoffload.results import write_atomic

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "results" / "runs" / "bench-multi-turn-reference.json"


class WorkStarted(Exception):
    """The stubbed replay, drawing or grid was reached: validation passed. ``args``: the stub's."""


def _stop(*args, **kwargs):
    raise WorkStarted(*args)


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setattr(kvoffload.cli.run, "replay", _stop)
    monkeypatch.setattr(kvoffload.cli.bench, "replay", _stop)
    monkeypatch.setattr(kvoffload.cli.sweep, "run_grid", _stop)
    monkeypatch.setattr(kvoffload.report, "draw_report", _stop)


PATHS = ("new.json", "file.json", "dir", "fifo", "link", "dangling", "file.json/x.json", "missing/x.json",
         "/dev/null", "", ".", str(RESULT), "bad.json",
         # issue 22: kernel interfaces, a name that fits and one that does not, option-like values
         "/proc/x.json", "/sys/kernel/x.json", "/proc/self/x", "n" * 240 + ".json", "n" * 256 + ".json", "-o.json",
         "--output=x.json")
WORKLOADS = ("multi-turn-small", "shared-prefix-small", "spec-decode-small", "nope", "w.toml", "file.json", "fifo",
             "dir", "mooncake:trace.jsonl", "mooncake:", "mooncake:fifo", "sharegpt:fifo", "", "multi-turn-small.toml")
FIXES = ("last_block_at_finish", "final_token_watermark", "aborted_watermark", "bogus", "")
PRESETS = ("vllm-0.25", "vllm-0.26", "vllm-0.29", "vllm-0.30", "vllm-0.99", "")
SETTINGS = ("cpu_chunks=64", "gpu_blocks=4096", "gpu_blocks=99999999999999999999", "gpu_blocks=x", "scheduling=async",
            "scheduling=eager", "seed=3", "spec_tokens=2", "workers=2000", "=", "noequals", "block_size=0",
            "slot_bytes=12", "profile=h200-llama3-8b", "profile=nope", "spec_acceptance=nan", "spec_acceptance=inf",
            "gpu_blocks=auto", "cpu_chunks=50%", "cpu_chunks=64GiB", "cpu_chunks=1e30GiB", "cpu_chunks=-5%",
            "cpu_chunks=nan%", "gpu_blocks=auto%",
            # issue 22: past a float, past 4,300 digits
            "cpu_chunks=1e999GiB", "cpu_chunks=1e300GiB", "cpu_chunks=1e200GiB", f"gpu_blocks={HUGE}", f"seed={HUGE}",
            f"cpu_chunks={HUGE}GiB", f"cpu_chunks={HUGE}%")
GRIDS = ("cpu_chunks=64,50%", "cpu_chunks=64,1e999GiB", "gpu_blocks=256,12", "gpu_blocks=auto,64", "seed=1,2",
         f"seed=1,{HUGE}", "seed=1," + "9" * 300, "blocks_per_chunk=1,2", "nope=1,2", "cpu_chunks=64,64", "cpu_chunks=",
         "spec_tokens=0,9999")


def value(pool, free_text: bool = True) -> st.SearchStrategy:
    return mostly(st.sampled_from(pool), texts, one_in=6) if free_text else st.sampled_from(pool)


OPTIONS = {
    "run": [("--workload", value(WORKLOADS)), ("--scheduling", value(("sync", "async", "eager"))),
            ("--disable-fix", value(FIXES)), ("--preset", value(PRESETS)), ("--set", value(SETTINGS)),
            ("--set", value(SETTINGS)), ("--out", value(PATHS)), ("--trace", value(PATHS)), ("--quiet", None),
            ("--max-steps", value(("1", "100", "0", "-5", "1e3", "99999999999999999999"))),
            ("--engine", value(("simulator", "vllm-scheduler", "bogus"))),
            # never a module of the standard library: --connector MODULE:CLASS imports and builds it
            ("--connector", value(("reference", "stock", "nope:X", "kvoffload:Nothing", ":"), free_text=False)),
            ("--bogus", None)],
    "bench": [("--small", None), ("--out-dir", value(PATHS)), ("--quiet", None), ("--workload", value(WORKLOADS))],
    "sweep": [("--workload", value(WORKLOADS)), ("--workload", value(WORKLOADS)), ("--grid", value(GRIDS)),
              ("--grid", value(GRIDS)), ("--set", value(SETTINGS)), ("--preset", value(PRESETS + ("reference",))),
              ("--jobs", value(("1", "2", "0", "-1", HUGE))),
              ("--shard", value(("0/2", "1/2", "2/2", "x", f"0/{HUGE}"))),
              ("--out-dir", value(PATHS)), ("--quiet", None)],
    "report": [("--from", value(PATHS)), ("--out", value(PATHS))],
    "workloads": [("list", None), ("show", None), ("", value(WORKLOADS))],
    "compare": [("", value(PATHS)), ("--format", value(("text", "json", "csv", "markdown", "xml"))),
                ("--fail-on-worse", None)],
    "fixes": [("--all", None)],
}


@st.composite
def command_line(draw, command: str | None = None) -> list[str]:
    """Mostly ``run`` (the command with the most flags), or ``command``; each flag mostly once,
    sometimes twice."""
    command = command or draw(mostly(st.just("run"), st.sampled_from(sorted(OPTIONS) + ["launch"]), one_in=2))
    argv = [command]
    if command == "bench" and draw(st.integers(0, 9)):
        argv.append("--small")  # the full workloads take seconds to generate; mostly the small ones
    if command == "sweep" and draw(st.integers(0, 9)):  # the one required flag, mostly given
        argv += ["--workload", draw(st.sampled_from(("multi-turn-small", "shared-prefix-small", "spec-decode-small")))]
    options = OPTIONS.get(command, [("--x", None)])
    chosen = draw(st.lists(st.sampled_from(options), max_size=5, unique_by=lambda option: (option[0], id(option))))
    if chosen and draw(st.integers(0, 5)) == 0:
        chosen.append(draw(st.sampled_from(chosen)))  # a flag given twice
    for flag, values in chosen:
        if flag:
            argv.append(flag)
        if values is not None:
            argv.append(draw(values))
    return argv


def make_paths(folder: Path) -> None:
    (folder / "file.json").write_text("{}")
    (folder / "bad.json").write_text('{"schema": ')
    (folder / "dir").mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "link").symlink_to(folder / "file.json")
    (folder / "dangling").symlink_to(folder / "nowhere")
    (folder / "w.toml").write_text((REPO / "workloads" / "multi-turn-small.toml").read_text())
    (folder / "trace.jsonl").write_text((REPO / "workloads" / "samples" / "mooncake-sample.jsonl").read_text())


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path): (path.lstat().st_mode, path.lstat().st_mtime_ns) for path in folder.rglob("*")}


def planned_outputs(argv: list[str], started: WorkStarted) -> list[Path]:
    """The result files a command that passed validation would write: ``run --out``/``--trace``
    as given (not the default path), a sweep's first cells."""
    if argv[0] == "sweep":
        cells, out_dir = started.args[:2]
        return [Path(out_dir) / cell.file_name() for cell in cells[:3]]
    if argv[0] != "run":
        return []
    return [Path(argv[i + 1]) for i, flag in enumerate(argv[:-1]) if flag in ("--out", "--trace")]


def write_as_the_command_would(path: Path) -> None:
    """Validation passed, so ``write_atomic`` must manage the file (issue 22: /proc, a temporary
    name too long were found only here, after the replay). A new file only, removed again with
    any folder made for it: nothing of the fuzz stays."""
    if os.path.lexists(path):
        return
    made = next((parent for parent in reversed(path.absolute().parents) if not parent.exists()), None)
    write_atomic(path, {"probe": True})
    if made is not None:
        shutil.rmtree(made)
    else:
        path.unlink()


@fuzz_settings(150)
@given(argv=command_line())
def test_fuzzed_command_lines(argv, stubbed, tmp_path_factory):
    INPUTS["command lines"] += 1
    check_command(argv, tmp_path_factory.mktemp("cli"))


@fuzz_settings(40)
@given(argv=command_line("sweep"))
def test_fuzzed_sweeps(argv, stubbed, tmp_path_factory):
    """A bad value anywhere in the grid is found before the first replay (issue 22)."""
    INPUTS["sweep grids"] += 1
    check_command(argv, tmp_path_factory.mktemp("sweep"))


def check_command(argv: list[str], folder: Path) -> None:
    make_paths(folder)
    before = snapshot(folder)
    out, err = StringIO(), StringIO()
    cwd = os.getcwd()
    os.chdir(folder)
    started = None
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    except WorkStarted as stub:
        code, started = None, stub
    finally:
        os.chdir(cwd)
    assert snapshot(folder) == before  # nothing written before the work starts, nor on bad input
    if code is None:
        os.chdir(folder)
        try:
            for path in planned_outputs(argv, started):
                write_as_the_command_would(path)
        finally:
            os.chdir(cwd)
        return
    assert code in (0, 2), err.getvalue()
    if code == 2:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvoffload: error: "), err.getvalue()
    else:
        assert err.getvalue() == ""
