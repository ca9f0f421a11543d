"""Ctrl-C: one line, exit 130, nothing half-written, whenever it comes.

Each test starts ``kvoffload run`` in a fresh process, waits for a phase (torch being imported,
the replay under way), sends SIGINT and checks what a user sees. Phases are found by watching the
process (its memory maps, its progress bar), not by sleeping, so a loaded machine does not change
what is tested.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="phases are read from /proc")


def start(folder: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "kvoffload.cli", "run", "--workload", "multi-turn-small", "--out",
               str(folder / "r.json"), "--trace", str(folder / "t.json"), *extra]
    return subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            restore_signals=True, preexec_fn=default_ctrl_c)


def default_ctrl_c() -> None:
    """A user's shell gives the command Ctrl-C's default action. A test runner started in the
    background (`cmd &` in a script, as some CI jobs are) has SIGINT ignored, and a child would
    inherit that and finish its run: give the child the user's disposition, not the runner's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition, process: subprocess.Popen, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, f"the process ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.005)


def interrupt(process: subprocess.Popen) -> tuple[int, str]:
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    return process.returncode, err.decode()


def assert_clean_interrupt(code: int, err: str, folder: Path) -> None:
    assert code == 130, err
    assert err.rsplit("\r", 1)[-1].strip() == "kvoffload: interrupted", err  # after the progress bar's \r
    assert "Traceback" not in err
    assert sorted(path.name for path in folder.iterdir()) == []  # no result, no trace, no temporary file


def test_ctrl_c_while_torch_imports(tmp_path):
    process = start(tmp_path, "--quiet")
    maps = Path(f"/proc/{process.pid}/maps")
    wait_for(lambda: "libtorch" in maps.read_text(), process, "torch import")
    assert_clean_interrupt(*interrupt(process), tmp_path)


def test_ctrl_c_during_the_replay(tmp_path):
    process = start(tmp_path)  # with its progress bar: the bar's first line says the replay started
    os.set_blocking(process.stderr.fileno(), False)
    seen = bytearray()

    def replay_started() -> bool:
        chunk = process.stderr.read()
        seen.extend(chunk or b"")
        return b"multi-turn-small [reference]" in seen

    wait_for(replay_started, process, "progress bar")
    os.set_blocking(process.stderr.fileno(), True)
    code, err = interrupt(process)
    assert_clean_interrupt(code, seen.decode() + err, tmp_path)


# What the fault trials of issue 31 found in the first second of a command, played on purpose:
# the Ctrl-C comes while a library runs, and the library leaves its trace. The command is
# `kvoffload fixes` with its work replaced by the story's.
LIBRARY_AT_CTRL_C = """
import ctypes, os, signal, sys
import kvoffload.cli.info as info
from kvoffload.cli import main

TRACE = sys.argv[1]
HELD = []

def work(args):
    if TRACE == "flag":
        # A KeyboardInterrupt inside Python code that a C library ran (PyRun_*) sets CPython's
        # flag for an unhandled one, handled or not: the interpreter killed itself with SIGINT at
        # exit (status -2, not 130), or aborted in torch's clean-up.
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 1
        raise KeyboardInterrupt
    if TRACE == "semaphore":
        # A parallel sweep's process pool: its queues' semaphores are registered with
        # multiprocessing's resource tracker, and unregistered by finalisers at a normal exit.
        import multiprocessing
        HELD.append(multiprocessing.get_context("spawn").Lock())
        raise KeyboardInterrupt
    try:  # numpy's import turns the KeyboardInterrupt into an ImportError
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    except KeyboardInterrupt:
        raise ImportError("PyCapsule_Import could not import module 'datetime'") from None

info._cmd_fixes = work
sys.argv = ["kvoffload", "fixes"]
sys.exit(main())
"""


@pytest.mark.parametrize("trace", ["flag", "import-error", "semaphore"])
def test_a_ctrl_c_a_library_leaves_its_trace_on_still_ends_with_130_and_one_line(trace, tmp_path):
    """Run as ``python -m`` (as the console script runs): that path honours CPython's flag."""
    (tmp_path / "story.py").write_text(LIBRARY_AT_CTRL_C)
    done = subprocess.run([sys.executable, "-m", "story", trace], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, preexec_fn=default_ctrl_c)
    assert (done.returncode, done.stderr) == (130, "kvoffload: interrupted\n")


@pytest.mark.parametrize("guarded", [True, False], ids=["KVOFFLOAD_DIE_WITH_PARENT=1", "unset"])
def test_a_scripts_step_dies_with_the_script_when_it_asks(guarded, tmp_path):
    """``benchmarks/publish`` killed by SIGKILL left its ``kvoffload report`` running as an orphan
    (issue 31's fault trials); a script that sets KVOFFLOAD_DIE_WITH_PARENT=1 takes its steps with
    it. Unset, a command outlives its parent, as ``nohup`` users expect."""
    env = {**os.environ, "KVOFFLOAD_DIE_WITH_PARENT": "1" if guarded else "0"}
    script = subprocess.Popen(["sh", "-c", f"{sys.executable} -m kvoffload.cli run --quiet --workload multi-turn "
                                           f"--out {tmp_path / 'r.json'}; true"], env=env, start_new_session=True)
    step = None
    try:
        wait_for(lambda: bool(children(script.pid)), script, "the step's start")
        step = children(script.pid)[0]
        maps = Path(f"/proc/{step}/maps")
        wait_for(lambda: "libtorch" in maps.read_text(), script, "the step's torch import")  # its main runs
        # Stopped, the step cannot finish its replay or die of anything but SIGKILL, which a stopped
        # process still takes: on a fast machine the replay ended within the wait below on main.
        os.kill(step, signal.SIGSTOP)
        script.kill()
        script.wait(timeout=60)
        deadline = time.monotonic() + (30 if guarded else 2)
        while running(step) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(step) is not guarded
    finally:
        if step is not None and running(step):
            os.kill(step, signal.SIGKILL)


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# A Ctrl-C after the command wrote to a stdout that can no longer take it: the disk is full
# (/dev/full) or a library closed the stream. The exit still flushes what it can, and says
# "interrupted" once, with 130, not a traceback from the flush.
STDOUT_GONE_AT_CTRL_C = """
import sys
import kvoffload.cli.info as info
from kvoffload.cli import main

def work(args):
    print("the first rows of a table")  # held in stdout's buffer: stdout is not a terminal
    if sys.argv[1] == "closed":
        sys.stdout.close()
    raise KeyboardInterrupt

info._cmd_fixes = work
sys.argv = ["kvoffload", "fixes"]
sys.exit(main())
"""


@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_a_ctrl_c_with_stdout_full_or_closed_still_ends_with_130_and_one_line(stdout, tmp_path):
    (tmp_path / "story.py").write_text(STDOUT_GONE_AT_CTRL_C)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the row stays in the buffer
    with open("/dev/full" if stdout == "full" else os.devnull, "w") as out:
        done = subprocess.run([sys.executable, "-m", "story", stdout], cwd=tmp_path, stdout=out, env=env,
                              stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=default_ctrl_c)
    assert (done.returncode, done.stderr) == (130, "kvoffload: interrupted\n")
