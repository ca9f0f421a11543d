"""The packaged gates (``pytest --pyargs kvoffload.gates``) name the bug a planted connector
ships: the reference with the final-token watermark switched off in code (vLLM PR #54288, the
bug of 0.26-0.29) fails K04's gates and not the other finish-path gates; a bad connector name
stops the run before any gate."""

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


def test_a_connector_without_the_watermark_fails_k04_only():
    """K04's gates and their neighbours on the finish path (K03, K07): only K04's fail. The whole
    plant table (every gate, every fix flag) is scripts/gates_table --matrix; CI keeps to these
    to stay within its time."""
    done = run_gates("--kv-connector", "broken_connector:WatermarkOffConnector", "-k", "K03 or K04 or K07")
    failed = sorted({line.split("::")[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert failed == ["TestK04FinalTokenWatermark"]
    assert " passed" in done.stdout  # K03's and K07's ran and passed


def test_a_bad_connector_name_errors_before_any_gate():
    done = run_gates("--kv-connector", "not a connector", "-x")
    assert done.returncode != 0 and "expects stock, reference or MODULE:CLASS" in done.stdout + done.stderr
    assert " passed" not in done.stdout
