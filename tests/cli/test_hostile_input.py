"""Input nobody here wrote: every class of issues 15, 22 and 31 fails fast, with one line, exit 2, nothing written.

Each case builds its files in a fresh folder, runs the command in-process and checks: exit 2, one
line on stderr starting ``kvoffload: error:`` and naming the problem, no traceback, no file
created, and a bounded time (the slow failures of the issue took 82 s to forever). Cases that can
kill the process (the nested ShareGPT file crashed pyarrow) run in a subprocess.

The cases live in ``hostile_cases.py`` beside this file (``python tests/cli/hostile_cases.py``
prints them as the closing table of issue 15).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_cases import (CASES, DEEP, HUGE, PROCESS_SECONDS, REPORT, RESULT, SECONDS, Case, asv_source, mooncake,
                           result_file)
from hostile_commands import COMMAND_CASES


def _run(case: Case, folder: Path, capsys) -> tuple[int, str, float]:
    argv = case.command(folder)
    started = time.perf_counter()
    if case.subprocess:
        done = subprocess.run([sys.executable, "-m", "kvoffload.cli", *argv], capture_output=True, text=True,
                              cwd=folder, timeout=120)
        return done.returncode, done.stderr, time.perf_counter() - started
    from kvoffload.cli import main

    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(SECONDS)  # a read that blocks (a FIFO) ends the case instead of the whole test run
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, capsys.readouterr().err, time.perf_counter() - started


class Hung(BaseException):
    """Raised by the alarm in a case that ran past SECONDS: not an Exception, so no handler in
    the command line turns it into a clean exit."""


def _hung(signum, frame):
    raise Hung(f"still running after {SECONDS} s")


@pytest.mark.parametrize("case", CASES + COMMAND_CASES, ids=[case.name for case in CASES + COMMAND_CASES])
def test_hostile_input_is_one_line_exit_2_and_nothing_written(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default result path would land here
    case.setup(tmp_path)
    before = {path: path.lstat().st_mtime_ns for path in tmp_path.rglob("*")}
    code, err, seconds = _run(case, tmp_path, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvoffload: error: ")
    assert case.message.replace("{tmp}", str(tmp_path)) in lines[0]
    assert {path: path.lstat().st_mtime_ns for path in tmp_path.rglob("*")} == before  # nothing written
    assert seconds < (PROCESS_SECONDS if case.subprocess else SECONDS)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
@pytest.mark.parametrize("name", ["benchmarks.json", "m/x.json"])
def test_an_unreadable_asv_file_is_one_line_exit_2(name, tmp_path, capsys):
    from kvoffload.cli import main

    asv_source(name, b"{}")(tmp_path)
    (tmp_path / "src" / "asv" / name).chmod(0)
    assert main(list(Case("", REPORT, "").command(tmp_path))) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"kvoffload: error: {tmp_path}/src/asv/{name}: cannot read (Permission denied)")
    assert not (tmp_path / "charts").exists()


def test_an_out_whose_temporary_file_is_past_path_max_is_refused_before_the_replay(tmp_path, capsys, monkeypatch):
    """The result's own path fits; the temporary file it is written through did not, and the write
    failed after the replay (issue 22). Paths relative to the case's folder: its absolute form is
    past PATH_MAX, so the generic case's snapshot could not stat it."""
    from kvoffload.cli import main

    monkeypatch.chdir(tmp_path)
    os.makedirs(DEEP)
    assert main(["run", "--quiet", "--workload", "multi-turn-small", "--out", f"{DEEP}/r.json"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("kvoffload: error: --out ddddd")
    assert line.endswith("a path of up to 4,109 bytes (the temporary file's included); this system takes at most 4,095")
    assert os.listdir(DEEP) == []


def test_report_lists_malformed_results_as_ignored_and_reads_the_rest(tmp_path):
    """``report`` over a folder where one result's provenance is a string (AttributeError before
    issue 22) and one holds a 5,000-digit number (passed over in silence): both are listed with
    what is wrong, the good result is read."""
    from kvoffload.report.sources import find_runs

    result_file("good.json")(tmp_path)
    result_file("string-provenance.json", provenance="by hand")(tmp_path)
    result_file("huge.json", raw=lambda text: text.replace('"steps": ', f'"steps": {HUGE}, "was": ', 1))(tmp_path)
    steps_line = next(number for number, line in enumerate(RESULT.read_text().splitlines(), 1) if '"steps": ' in line)
    runs, ignored = find_runs(tmp_path)
    assert [run.path.name for run in runs] == ["good.json"]
    assert ignored == [
        f"{tmp_path}/huge.json: expected integers of at most 4,300 digits, got an integer of 5,000 digits at line "
        f"{steps_line}",
        f"{tmp_path}/string-provenance.json: key provenance: expected an object or null, got 'by hand'"]


def test_a_long_gap_is_accepted_not_rejected(tmp_path):
    """A 1e10 ms gap is representable (5e8 steps at 20 ms): the engine skips idle gaps in one jump,
    so it is not bad input."""
    from kvoffload.workloads import load_workload

    mooncake({"timestamp": 10**10})(tmp_path)
    workload = load_workload(f"mooncake:{tmp_path}/trace.jsonl")
    assert [spec.arrival_step for spec in workload.requests] == [0, 10**10 // 20]


def test_an_error_line_shows_a_value_up_to_the_longest_word_whole_and_cuts_a_longer_one():
    """A path or --set value of LONGEST_WORD characters is echoed whole; one character more and
    its middle is cut, its start, its length and its end still shown (app.shorten)."""
    from kvoffload.cli.app import LONGEST_WORD, shorten

    whole = "a" + "9" * (LONGEST_WORD - 2) + "z"
    assert shorten(f"--set seed: got {whole} here") == f"--set seed: got {whole} here"
    longer = "a" + "9" * (LONGEST_WORD - 1) + "z"
    message = f"--set seed: got {longer} here"
    cut = shorten(message)
    assert cut.startswith("--set seed: got a999") and cut.endswith("999z here")
    assert f"...({LONGEST_WORD + 1:,} characters)..." in cut and len(cut) < len(message)
