"""The packaged gates (``pytest --pyargs kvoffload.gates``) name the bug a planted connector
ships: the reference with the final-token watermark switched off in code (vLLM PR #54288, the
bug of 0.26-0.29) fails K04's gates and not the other finish-path gates; a bad connector name,
preset or fix flag stops the run in one line before any gate is collected.

The planted run goes through pytester in this process (vLLM and torch are imported once; a
child pytest spent most of its time importing them again); the bad options go through a child
pytest, which stops before importing either."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm
pytest_plugins = ["pytester"]

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
def test_a_connector_without_the_watermark_fails_k04_only(pytester, monkeypatch):
    """K04's gates and their neighbours on the finish path (K03, K07): only K04's fail. The whole
    plant table (every gate, every fix flag) is scripts/gates_table --matrix. On demand
    (scripts/vllm-on-demand), not in CI."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # broken_connector
    plugin = () if _entry_point_registered() else ("-p", "kvoffload.gates.plugin")
    run = pytester.inline_run("-q", "-p", "no:cacheprovider", *plugin, "--pyargs", "kvoffload.gates",
                              "--kv-connector", "broken_connector:WatermarkOffConnector", "-k", "K03 or K04 or K07")
    passed, _, failed = run.listoutcomes()
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    assert {report.nodeid.split("::")[1] for report in failed} == {"TestK04FinalTokenWatermark"}
    assert passed  # K03's and K07's ran and passed


ON_DEMAND = pytest.mark.vllm_on_demand  # CI keeps one bad option (a child pytest each: about 2 s)


@pytest.mark.parametrize("options, says", [
    (("--kv-connector", "not a connector"), "expects stock, reference or MODULE:CLASS"),
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
