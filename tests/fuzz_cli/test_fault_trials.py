"""Fault trials under pytest (issue 31; the harness, and what it counts: ``fault_trials.py``).

CI's default profile: the harness proven on a planted command (an orphan, a partial file and a
changed tracked file are each counted), and one real trial: ``releases`` ended by SIGKILL. The
nightly profile (``KVOFFLOAD_FUZZ=nightly``, ``.ci/nightly``): every command x SIGINT and SIGKILL
x ``KVOFFLOAD_FAULT_RUNS`` (default 3) seeds from ``KVOFFLOAD_FUZZ_SEED`` (fresh each night,
printed in the table's heading); the table of every trial is printed at the end, and written to
``KVOFFLOAD_FAULT_TABLE`` where that is set.
"""

from __future__ import annotations

import os
import secrets

import pytest
from fault_trials import COMMANDS, SIGNALS, TRIALS, Command, describe, make_copy, run_trial
from fuzz_inputs import NIGHTLY

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="orphans are found in /proc")

RUNS = int(os.environ.get("KVOFFLOAD_FAULT_RUNS", "3"))
BASE_SEED = int(os.environ.get("KVOFFLOAD_FUZZ_SEED") or (secrets.randbits(31) if NIGHTLY else 31))
PLAN = ([(command, signal_name, BASE_SEED + run) for command in COMMANDS for signal_name in SIGNALS
         for run in range(RUNS)] if NIGHTLY else [("releases", "SIGKILL", BASE_SEED)])

# Every fault the harness counts, planted: a background child that outlives the command, a file
# cut short under its final name, a tracked file changed. A second run (after SIGKILL) ends at once.
PLANTED = Command("planted", ("sh", "-c", "mkdir -p out/planted; [ -e out/planted/.ran ] && exit 0; "
                                          "touch out/planted/.ran; sleep 600 & printf '{\"cut' > out/planted/r.json; "
                                          "echo planted-change >> README.md; sleep 600"), ("out/planted",), seconds=2.5,
                  settle=2.0)


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return make_copy(tmp_path_factory.mktemp("trials"), publish=any(command == "publish" for command, _, _ in PLAN))


def test_the_harness_counts_each_planted_fault(copy):
    trial = run_trial(copy, PLANTED, "SIGKILL", BASE_SEED)
    assert not trial.finished_first and trial.exit == -9
    # sh dies alone: its background sleep and the foreground one it waited for both run on
    assert [line.split(" ", 1)[1].split()[0] for line in trial.orphans] == ["sleep", "sleep"]
    assert trial.partial == ["partial: out/planted/r.json"]
    assert trial.changed == [" M README.md"]
    assert not trial.clean
    assert not (copy / "out" / "planted").exists() and "planted-change" not in (copy / "README.md").read_text()  # reset


@pytest.mark.parametrize("command, signal_name, seed", PLAN, ids=[f"{c}-{s}-{seed}" for c, s, seed in PLAN])
def test_a_command_ended_at_a_drawn_moment_leaves_nothing_behind(copy, command, signal_name, seed):
    trial = run_trial(copy, COMMANDS[command], signal_name, seed)
    TRIALS.append(trial)
    assert trial.clean, describe(trial)
