"""The gate's counted number: instructions per build_connector_meta step under callgrind, compared
on the baseline's machine and count environment, failing 3 % above the baseline at any load.

The stories with a stand-in count pin the rule; the last one counts for real (valgrind, about a
minute): the decode batch as it is, and with a planted slowdown of about 5 % in
build_connector_meta (a copy of the package with an idle loop at the top of the method).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload import counts, gate, gate_counts
from kvoffload.cli import main

REPO = Path(__file__).resolve().parents[2]
KEY = gate_counts.key()
ENVIRONMENT = {"valgrind": "valgrind-3.19.0", "python": "3.11.7", "implementation": "CPython GCC", "machine": "x86_64"}


@pytest.mark.parametrize("now, verdict", [(1_020_000.0, "ok"), (1_029_000.0, "ok"), (1_050_000.0, "costlier"),
                                          (900_000.0, "ok")])
def test_a_count_fails_only_beyond_3_percent_above_the_baseline(now, verdict, monkeypatch):
    monkeypatch.setattr(counts, "available", lambda: True)
    baseline = {"machine": "m1", "counted": {KEY: 1_000_000.0}}
    [(run, metric, before, after, said, allowed)] = gate_counts.verdicts(baseline, {KEY: now}, "m1")
    assert (run, metric, before, after, said, allowed) == (gate_counts.COUNTED_RUN, "instructions_per_step",
                                                           1_000_000.0, now, verdict, "+3%")


@pytest.fixture
def counting(monkeypatch, tmp_path):
    """The gate narrowed to multi-turn-small x the reference; valgrind and its environment played."""
    monkeypatch.setattr(gate, "WORKLOADS", ("multi-turn-small",))
    monkeypatch.setattr(gate, "CONNECTORS", (None,))
    monkeypatch.setattr(counts, "available", lambda: True)
    monkeypatch.setattr(gate_counts, "environment", lambda: dict(ENVIRONMENT))
    found = {"value": 836_591.8}
    monkeypatch.setattr(gate_counts, "collect", lambda: {KEY: found["value"]})
    return found


def test_the_baseline_keeps_the_count_and_a_5_percent_slowdown_fails_the_gate(counting, tmp_path, capsys):
    path = tmp_path / "baseline.json"
    assert main(["gate", "--update", "--baseline", str(path), "--machine", "m1"]) == 0
    document = json.loads(path.read_text())
    assert document["counted"] == {KEY: 836_591.8} and document["count_environment"] == ENVIRONMENT
    capsys.readouterr()
    counting["value"] = 836_591.8 * 1.01  # the same code, counted again: within its noise
    assert main(["gate", "--baseline", str(path), "--machine", "m1"]) == 0
    assert "counted (instructions under callgrind, load-independent; fails beyond +3%): 0 of 1 costlier" in \
        capsys.readouterr().out
    counting["value"] = 836_591.8 * 1.05
    assert main(["gate", "--baseline", str(path), "--machine", "m1"]) == 1
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith(gate_counts.COUNTED_RUN)]
    assert "(+5.0%)  costlier (allowed +3%)" in row
    assert "kvoffload gate: FAIL (1 numbers)" in out


def test_another_machine_or_environment_does_not_count_at_all(counting, tmp_path, capsys, monkeypatch):
    path = tmp_path / "baseline.json"
    assert main(["gate", "--update", "--baseline", str(path), "--machine", "m1"]) == 0
    monkeypatch.setattr(gate_counts, "collect", lambda: pytest.fail("counted where nothing is compared"))
    capsys.readouterr()
    assert main(["gate", "--baseline", str(path), "--machine", "m2"]) == 0
    monkeypatch.setattr(gate_counts, "environment", lambda: {**ENVIRONMENT, "valgrind": "valgrind-3.22.0"})
    assert main(["gate", "--baseline", str(path), "--machine", "m1"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"{gate_counts.COUNTED_RUN}  instructions_per_step") == 2 and "not compared" in out


def plant_slowdown(tmp_path: Path, iterations: int) -> Path:
    """A copy of the package whose build_connector_meta first idles ``iterations`` times; the
    checkout's benchmarks/ beside it, as counts.SUITE expects."""
    root = tmp_path / "planted"
    shutil.copytree(REPO / "reference" / "kvoffload", root / "reference" / "kvoffload",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "benchmarks").symlink_to(REPO / "benchmarks")
    scheduler = root / "reference" / "kvoffload" / "core" / "scheduler.py"
    head = "    def build_connector_meta(self, out: SchedulerOutput) -> StepPlan:\n"
    text = scheduler.read_text()
    assert head in text
    scheduler.write_text(text.replace(head, head + f"        for _ in range({iterations}):  # planted\n"
                                                   "            pass\n", 1))
    return root / "reference"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="no valgrind (CI installs it: .ci/run)")
def test_a_planted_5_percent_slowdown_in_build_connector_meta_is_counted_and_flagged(real_counts, tmp_path):
    """350 idle iterations cost about 5 % of the decode batch's 0.84 M instructions a step on
    CPython 3.11 (measured here: 250 +2.9 %, 340 +4.75 %, 500 +8.6 %, 1,000 +20.7 %; an int past 256
    is allocated, so the cost per iteration grows)."""
    before = counts.count("connector", "1")
    planted = subprocess.run([sys.executable, "-c", "from kvoffload import counts; print(counts.count('connector', '1'))"],
                             capture_output=True, text=True, timeout=1800,
                             env={**os.environ, "PYTHONPATH": str(plant_slowdown(tmp_path, 350))})
    assert planted.returncode == 0, planted.stderr[-2000:]
    after = float(planted.stdout.split()[-1])
    assert 0.03 < after / before - 1 < 0.10, (before, after)
    rows = gate_counts.verdicts({"machine": "m", "counted": {KEY: before}}, {KEY: after}, "m")
    assert [row[4] for row in rows] == ["costlier"]


def test_the_count_environment_is_asked_of_valgrind_only_where_it_is(monkeypatch):
    monkeypatch.setattr(counts, "environment", lambda: dict(ENVIRONMENT))
    monkeypatch.setattr(counts, "available", lambda: True)
    assert gate_counts.environment() == ENVIRONMENT
    monkeypatch.setattr(counts, "available", lambda: False)
    assert gate_counts.environment() == {}


@pytest.mark.parametrize("argv", [["multi-turn-small", "x"], ["--", "multi-turn-small", "x"], ["--"]],
                         ids=["no --", "two subjects", "no subject"])
def test_the_counted_child_given_other_arguments_prints_its_usage_and_counts_nothing(argv, tmp_path):
    """``python -m kvoffload.counts`` is valgrind's child: run with other arguments than ``--``
    and one subject, it says how it is run (exit 2) instead of replaying something else."""
    env = {**os.environ, "KVOFFLOAD_COUNT_MODE": "replay",
           "PYTHONPATH": os.pathsep.join([str(REPO / "reference"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "kvoffload.counts", *argv], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("usage: KVOFFLOAD_COUNT_MODE=connector|replay python -m kvoffload.counts --")
