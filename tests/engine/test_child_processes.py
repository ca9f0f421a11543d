"""The replay's child interpreter (``kvoffload.vllm.pinned``) is bounded and never outlives its
parent: a child that sends nothing (a hang no alarm interrupts) is killed at the silence bound,
and a child whose parent is killed dies with it (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HANGS = """
import os, time

def hangs(pid_file, *, on_step=None):
    with open(pid_file, "w") as out:
        out.write(str(os.getpid()))
    while True:
        time.sleep(1000)
"""

PARENT = """
import sys
import kvoffload.vllm.pinned as pinned
from hanging import hangs

pinned.START_BOUND_S = 0  # the silence bound is then twice the step bound
try:
    pinned.call_pinned(hangs, sys.argv[1], bound_s=float(sys.argv[2]))
except pinned.ConnectorTimeout as error:
    print("TIMEOUT:", error)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, awaiting its reaper
        return stat.read().split(") ")[1][0] != "Z"


def start_parent(tmp_path, bound_s: str) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "hanging.py").write_text(HANGS)
    pid_file = tmp_path / "child.pid"
    env = dict(os.environ, PYTHONHASHSEED="1", PYTHONPATH=os.pathsep.join([str(ROOT / "reference"), str(tmp_path)]))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pid_file), bound_s], env=env,
                              stdout=subprocess.PIPE, text=True)
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text():
            return parent, pid_file
        time.sleep(0.1)
    parent.kill()
    pytest.fail("the child never started")


def wait_dead(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_silent_child_is_killed_at_the_bound(tmp_path):
    parent, pid_file = start_parent(tmp_path, "1")
    out, _ = parent.communicate(timeout=60)
    assert "TIMEOUT: the replay's child interpreter sent nothing for 2 s" in out
    assert wait_dead(int(pid_file.read_text()))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_with_its_parent(tmp_path):
    parent, pid_file = start_parent(tmp_path, "600")
    child = int(pid_file.read_text())
    assert alive(child)
    parent.send_signal(signal.SIGKILL)  # no finally runs in the parent
    parent.wait(timeout=30)
    try:
        assert wait_dead(child), "the child outlived its parent"
    finally:
        if alive(child):  # leave no orphan behind, whatever the verdict
            os.kill(child, signal.SIGKILL)
