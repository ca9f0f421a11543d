"""Every fix flag has a gate: with the flag made ineffective everywhere (the stories' "fixed"
side too), at least one catalogue gate fails. The flag list is read from the code, so a new
flag without a gate fails here. ``scripts/gates_table`` runs the same replays without -x to
list every gate each flag trips (the table in tests/gates/README.md)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.core.fixes import Fixes

GATES = Path(__file__).parent
ROOT = GATES.parents[1]
FLAGS = [field.name for field in dataclasses.fields(Fixes) if field.type in (bool, "bool")]  # not `rules`

pytestmark = pytest.mark.skipif(bool(os.environ.get("KVOFFLOAD_GATES_DISABLE")),
                                reason="already inside a flag replay")


def replay_gates(flag: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KVOFFLOAD_GATES_DISABLE=flag)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                           "-o", "addopts=--import-mode=importlib", *extra, str(GATES),
                           f"--ignore={Path(__file__)}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("flag", FLAGS)
def test_turning_the_flag_off_fails_a_gate(flag):
    result = replay_gates(flag, "-x")
    assert result.returncode == 1, f"no gate fails without {flag}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
