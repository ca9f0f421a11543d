"""``kvoffload releases`` held to ``run``'s contract (issue 31): what a release venv prints is
checked, never trusted; its whole process tree dies on ``--timeout`` and when ``releases`` itself
is killed; the venvs are found from outside the checkout. The "release" is a stand-in venv whose
``python`` runs a few lines of Python (``STAND_IN`` of ``test_releases.py`` is the well-behaved
one); the bad inputs refused before any venv starts are in ``hostile_commands.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.cli import releases as releases_cli
from kvoffload.release_io import split_job
from release_venvs import stand_in_venv

ARGS = ["releases", "--release", "0.29.0", "--workload", "multi-turn-small", "--scheduling", "sync"]


def printing(text: str) -> str:
    return f"import sys\nsys.stdout.write({text!r})\n"


GOOD_ROW = {"release": "0.29.0", "workload": "multi-turn-small", "scheduling": "sync", "metrics": {"crashes": 0},
            "error": None, "leaked": [], "stuck": [], "first_admission": {"r0": [0, 16]}}

MALFORMED = [
    ("a line cut short", json.dumps(GOOD_ROW)[:40] + "\n", "output line 1 is not a JSON row"),
    ("an empty object", "{}\n", "row 1 (multi-turn-small:sync): key workload: expected 'multi-turn-small', got None"),
    ("another workload's row", json.dumps({**GOOD_ROW, "workload": "spec-decode-small"}) + "\n",
     "key workload: expected 'multi-turn-small', got 'spec-decode-small'"),
    ("admissions as a list", json.dumps({**GOOD_ROW, "first_admission": [[0, 16]]}) + "\n",
     "key first_admission: expected {request: [GPU-hit tokens, connector-hit tokens]}"),
    ("an admission of one number", json.dumps({**GOOD_ROW, "first_admission": {"r0": [16]}}) + "\n",
     "key first_admission: request 'r0': expected [GPU-hit tokens, connector-hit tokens], got [16]\n"),
    ("a hit count no int64 holds", json.dumps({**GOOD_ROW, "first_admission": {"r0": [2**63, 16]}}) + "\n",
     "request 'r0': expected [GPU-hit tokens, connector-hit tokens], got [9223372036854775808, 16]\n"),
    ("admissions as a long list (shown cut)", json.dumps({**GOOD_ROW, "first_admission": [[0, 16]] * 20}) + "\n",
     f"connector-hit tokens]}}, got {repr([[0, 16]] * 20)[:57]}...\n"),
    ("a metric that is text", json.dumps({**GOOD_ROW, "metrics": {"crashes": "none"}}) + "\n",
     "key metrics: crashes: expected a finite number or null, got 'none'"),
    ("an error that is text", json.dumps({**GOOD_ROW, "error": "boom"}) + "\n",
     "key error: expected null or {\"message\": text, \"step\": integer}, got 'boom'"),
    ("no metrics", json.dumps({key: v for key, v in GOOD_ROW.items() if key != "metrics"}) + "\n",
     "key metrics: missing"),
    ("a JSON array", "[1, 2]\n{\n", "output line 2 is not a JSON row"),
    ("two rows for one replay", (json.dumps(GOOD_ROW) + "\n") * 2, "2 rows for 1 replays"),
]


@pytest.mark.parametrize("printed, message", [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_what_a_release_prints_is_checked_and_refused_in_one_line(printed, message, tmp_path, monkeypatch, capsys):
    """A release venv that prints malformed JSON, ``{}`` or rows of the wrong shape: one line
    naming the release and what is wrong, no traceback, no table written (a KeyError or a
    JSONDecodeError escaped before issue 31)."""
    stand_in_venv(tmp_path, printing(printed))
    monkeypatch.chdir(tmp_path)
    code = main([*ARGS, "--out", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("kvoffload: error: vLLM 0.29.0: "), err
    assert message in err
    assert not (tmp_path / "t.json").exists()


def test_a_timeout_too_long_for_the_system_is_refused_before_the_venv_starts(tmp_path, monkeypatch, capsys):
    """``--timeout 10**20`` with the venv there: an OverflowError traceback from subprocess
    before issue 31."""
    started = tmp_path / "started"
    stand_in_venv(tmp_path, f"open({str(started)!r}, 'w')\n")
    monkeypatch.chdir(tmp_path)
    assert main([*ARGS, "--timeout", "1" + "0" * 20, "--out", str(tmp_path / "t.json")]) == 2
    assert capsys.readouterr().err == ("kvoffload: error: argument --timeout: expected whole seconds from 1 to "
                                       "1,000,000, got '100000000000000000000'\n")
    assert not started.exists()


def test_the_venvs_are_found_in_the_checkout_from_any_folder(tmp_path, monkeypatch, capsys):
    """Run outside the checkout, releases looked for the venvs in the current folder only."""
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    elsewhere.mkdir()
    stand_in_venv(checkout, printing(json.dumps(GOOD_ROW) + "\n"))
    monkeypatch.setattr(releases_cli, "CHECKOUT", checkout)
    monkeypatch.chdir(elsewhere)
    assert main([*ARGS, "--out", "t.json"]) == 0, capsys.readouterr().err
    table = json.loads((elsewhere / "t.json").read_text())
    assert [entry["release"] for entry in table["releases"]] == ["0.29.0"]

    monkeypatch.setattr(releases_cli, "CHECKOUT", tmp_path / "no-checkout")
    assert main([*ARGS, "--out", "t.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"no venv for 0.29.0 in {elsewhere} and {tmp_path / 'no-checkout'}: create it with" in err


def test_a_job_is_split_at_its_last_colon():
    """``--workload mooncake:FILE`` reached the release as ``mooncake:FILE:sync`` and was split at
    its first colon ("mooncake: unknown workload" in the venv)."""
    assert split_job("mooncake:/data/trace.jsonl:async") == ("mooncake:/data/trace.jsonl", "async")
    assert split_job("multi-turn-small:sync") == ("multi-turn-small", "sync")
    assert split_job("sharegpt:chat.json") == ("sharegpt:chat.json", "sync")  # no scheduling: sync
    assert split_job("multi-turn-small") == ("multi-turn-small", "sync")


# ---- the process tree ------------------------------------------------------------------------

# A release that starts a replay of its own (a grandchild of ``releases``) and never finishes:
# it writes both pids, then waits. It calls die_with_parent first, as kvoffload.vllm.rows does.
TREE = """
import os, subprocess, sys, time
from kvoffload.release_io import die_with_parent
die_with_parent()
replay = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["KVOFFLOAD_TEST_PIDS"] + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {replay.pid}")
os.rename(os.environ["KVOFFLOAD_TEST_PIDS"] + ".tmp", os.environ["KVOFFLOAD_TEST_PIDS"])
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """A process that runs (a zombie, whose parent has not reaped it yet, has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def start_releases(folder: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    stand_in_venv(folder, TREE)
    pids = folder / "pids"
    process = subprocess.Popen([sys.executable, "-m", "kvoffload.cli", *ARGS, "--out", str(folder / "t.json"), *extra],
                               cwd=folder, env={**os.environ, "KVOFFLOAD_TEST_PIDS": str(pids)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a user's Ctrl-C
    return process, pids


def read_pids(process: subprocess.Popen, pids: Path) -> list[int]:
    wait_until(lambda: pids.exists() or process.poll() is not None, 120, "the stand-in release never started")
    assert pids.exists(), process.communicate()[1]
    return [int(pid) for pid in pids.read_text().split()]


def end_all(process: subprocess.Popen, pids: list[int]) -> None:
    """Whatever the story's outcome, nothing it started outlives it."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process states are read from /proc")
def test_on_timeout_every_process_of_the_release_dies(tmp_path):
    """Before issue 31 only the direct child was killed and the release's replays ran on."""
    process, pids_file = start_releases(tmp_path, "--timeout", "8")
    pids = []
    try:
        pids = read_pids(process, pids_file)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 2
        assert err == "kvoffload: error: vLLM 0.29.0: its replays took more than --timeout 8 s (every process of it " \
                      "killed)\n"
        wait_until(lambda: not any(alive(pid) for pid in pids), 30, f"still running: {[p for p in pids if alive(p)]}")
    finally:
        end_all(process, pids)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process states are read from /proc")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_when_releases_is_killed_every_process_of_the_release_dies(how, tmp_path):
    """``kill -9`` of ``releases`` (nothing of it runs to clean up) ends the release's interpreter
    (its parent-death signal) and the replay it started (its watcher process kills the group); a Ctrl-C
    ends them too (the release's session does not get the terminal's signal) and exits 130."""
    process, pids_file = start_releases(tmp_path)
    pids = []
    try:
        pids = read_pids(process, pids_file)
        os.kill(process.pid, how)
        _, err = process.communicate(timeout=60)
        wait_until(lambda: not any(alive(pid) for pid in pids), 30, f"still running: {[p for p in pids if alive(p)]}")
    finally:
        end_all(process, pids)
    assert not (tmp_path / "t.json").exists()
    if how == signal.SIGINT:
        assert (process.returncode, err) == (130, "kvoffload: interrupted\n")


# A release that prints its row and exits, leaving behind a child that holds its stdout.
LEAVES_A_CHILD = """
import json, os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["KVOFFLOAD_TEST_PIDS"], "w") as handle:
    handle.write(str(child.pid))
print(json.dumps(ROW))
""".replace("ROW", repr(GOOD_ROW))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process states are read from /proc")
def test_a_release_that_exits_leaving_a_child_is_read_at_once_and_its_child_killed(tmp_path, monkeypatch, capsys):
    """Its output was read from pipes to their end, which the child held open: releases waited
    for it until --timeout (issue 31's fault trials)."""
    stand_in_venv(tmp_path, LEAVES_A_CHILD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVOFFLOAD_TEST_PIDS", str(tmp_path / "pids"))
    started = time.monotonic()
    code = main([*ARGS, "--timeout", "120", "--out", str(tmp_path / "t.json")])
    assert code == 0, capsys.readouterr().err
    assert time.monotonic() - started < 100  # not the --timeout: no wait for the child (bound, not a target)
    child = int((tmp_path / "pids").read_text())
    wait_until(lambda: not alive(child), 30, "the child the release left behind still runs")
