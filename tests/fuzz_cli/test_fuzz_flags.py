"""Fuzzed command lines, in-process: every combination of flags, repeated flags, bad values and
hostile output paths either fails with one line (exit 2, nothing written) or passes validation.

Validation must be complete before any work: ``run`` and ``bench`` have their replay replaced by
a stub that stops the command, and the test checks that nothing was written up to that point (a
result can only be written after the replay). ``report`` has its drawing stubbed the same way.
"""

from __future__ import annotations

import os
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from fuzz_inputs import fuzz_settings, mostly, texts
from hypothesis import given
from hypothesis import strategies as st

import kvoffload.cli.bench
import kvoffload.cli.run
import kvoffload.report
from kvoffload.cli import main

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "results" / "runs" / "bench-multi-turn-reference.json"


class WorkStarted(Exception):
    """The stubbed replay or drawing was reached: validation passed."""


def _stop(*args, **kwargs):
    raise WorkStarted


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setattr(kvoffload.cli.run, "replay", _stop)
    monkeypatch.setattr(kvoffload.cli.bench, "replay", _stop)
    monkeypatch.setattr(kvoffload.report, "draw_report", _stop)


PATHS = ("new.json", "file.json", "dir", "fifo", "link", "dangling", "file.json/x.json", "missing/x.json",
         "/dev/null", "", ".", str(RESULT), "bad.json")
WORKLOADS = ("multi-turn-small", "shared-prefix-small", "spec-decode-small", "nope", "w.toml", "file.json", "fifo",
             "dir", "mooncake:trace.jsonl", "mooncake:", "mooncake:fifo", "sharegpt:fifo", "", "multi-turn-small.toml")
FIXES = ("last_block_at_finish", "final_token_watermark", "aborted_watermark", "bogus", "")
PRESETS = ("vllm-0.25", "vllm-0.26", "vllm-0.29", "vllm-0.30", "vllm-0.99", "")
SETTINGS = ("cpu_chunks=64", "gpu_blocks=4096", "gpu_blocks=99999999999999999999", "gpu_blocks=x", "scheduling=async",
            "scheduling=eager", "seed=3", "spec_tokens=2", "workers=2000", "=", "noequals", "block_size=0",
            "slot_bytes=12", "profile=h200-llama3-8b", "profile=nope", "spec_acceptance=nan", "spec_acceptance=inf",
            "gpu_blocks=auto", "cpu_chunks=50%", "cpu_chunks=64GiB", "cpu_chunks=1e30GiB", "cpu_chunks=-5%",
            "cpu_chunks=nan%", "gpu_blocks=auto%")


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
    "report": [("--from", value(PATHS)), ("--out", value(PATHS))],
    "workloads": [("list", None), ("show", None), ("", value(WORKLOADS))],
    "compare": [("", value(PATHS)), ("--format", value(("text", "json", "csv", "markdown", "xml"))),
                ("--fail-on-worse", None)],
    "fixes": [("--all", None)],
}


@st.composite
def command_line(draw) -> list[str]:
    """Mostly ``run`` (the command with the most flags); each flag mostly once, sometimes twice."""
    command = draw(mostly(st.just("run"), st.sampled_from(sorted(OPTIONS) + ["launch"]), one_in=2))
    argv = [command]
    if command == "bench" and draw(st.integers(0, 9)):
        argv.append("--small")  # the full workloads take seconds to generate; mostly the small ones
    options = OPTIONS.get(command, [("--x", None)])
    chosen = draw(st.lists(st.sampled_from(options), max_size=5, unique_by=lambda option: option[0]))
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


@fuzz_settings(150)
@given(argv=command_line())
def test_fuzzed_command_lines(argv, stubbed, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    make_paths(folder)
    before = snapshot(folder)
    out, err = StringIO(), StringIO()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    except WorkStarted:
        code = None
    finally:
        os.chdir(cwd)
    assert snapshot(folder) == before  # nothing written before the work starts, nor on bad input
    if code is None:
        return
    assert code in (0, 2), err.getvalue()
    if code == 2:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvoffload: error: "), err.getvalue()
    else:
        assert err.getvalue() == ""
