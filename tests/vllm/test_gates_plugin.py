"""The packaged gates (``pytest --pyargs kvoffload.gates``) name the bug a planted connector
ships: the reference with the final-token watermark switched off in code (vLLM PR #54288, the
bug of 0.26-0.29) fails K04's gates and not the other finish-path gates; a bad connector name,
preset or fix flag stops the run in one line before any gate is collected.

Both go through a child pytest; the bad options stop it before vLLM is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]


def run_gates(*options: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(ROOT / "reference")]))
    plugin = () if _entry_point_registered() else ("-p", "kvoffload.gates.plugin")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *plugin,
                           "--pyargs", "kvoffload.gates", *options], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


def _entry_point_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "kvoffload.gates.plugin" for ep in entry_points(group="pytest11"))


@pytest.mark.vllm_on_demand
def test_a_connector_without_the_watermark_fails_k04_only():
    """K04's gates and their neighbours on the finish path (K03, K07): only K04's fail. The whole
    plant table (every gate, every fix flag) is scripts/gates_table --matrix. On demand
    (scripts/vllm-on-demand), not in CI. A child pytest, not pytester in this process: pytester
    drops the modules an inner run imported, and vLLM imported again registers its torch ops
    twice (a RuntimeError in every later vLLM test here)."""
    done = run_gates("--kv-connector", "broken_connector:WatermarkOffConnector", "-k", "K03 or K04 or K07")
    failed = sorted({line.split("::")[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert failed == ["TestK04FinalTokenWatermark"]
    assert " passed" in done.stdout  # K03's and K07's ran and passed


ON_DEMAND = pytest.mark.vllm_on_demand  # CI keeps one bad option (a child pytest each: about 2 s)


@pytest.mark.parametrize("options, says", [
    (("--kv-connector", "not a connector"), "expects stock, reference, simple-cpu, simple-cpu-lazy, example, peer, MODULE:CLASS, or A+B"),
    pytest.param(("--kv-connector", "stock", "--kv-preset", "vllm-0.26"), "apply to the reference connector",
                 marks=ON_DEMAND),
    pytest.param(("--kv-preset", "vllm-0.99"), "unknown preset 'vllm-0.99'", marks=ON_DEMAND),
    pytest.param(("--kv-disable", "no_such_fix"), "no_such_fix", marks=ON_DEMAND),
], ids=["connector", "stock with a preset", "preset", "fix flag"])
def test_a_bad_option_errors_in_one_line_before_any_gate(options, says):
    done = run_gates(*options, "-x")
    errors = [line for line in (done.stdout + done.stderr).splitlines() if says in line]
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and len(errors) == 1, done.stdout + done.stderr
    assert " passed" not in done.stdout and "collected" not in done.stdout
