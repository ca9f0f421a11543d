"""``kvoffload run`` and ``bench`` with ``--engine vllm-scheduler``: result files that read like
the simulator's, with the engine named and unmeasurable metrics left out."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.cli import main  # noqa: E402
from kvoffload.metrics import METRIC_NAMES, MODEL_METRICS  # noqa: E402
from kvoffload.vllm.replay import STORE_SUBMIT_DELAYS, UNMEASURED  # noqa: E402


def test_run_on_vllms_scheduler_with_the_stock_connector_writes_a_result(tmp_path, capsys):
    out = tmp_path / "stock.json"
    code = main(["run", "--engine", "vllm-scheduler", "--connector", "stock", "--workload", "shared-prefix-small",
                 "--quiet", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["config"]["engine"] == "vllm-scheduler" and result["config"]["connector"] == "stock"
    assert result["connector"]["name"] == "stock" and result["connector"]["label"] == "vllm-stock"
    metrics = result["metrics"]
    # vLLM's manager has no strict lifecycle mode: that count is absent for stock, not 0; store
    # submission delays are measured at the torch-copy worker's handler; a real model's metrics
    # belong to --engine vllm: absent here
    assert set(metrics) == ((set(METRIC_NAMES) - set(UNMEASURED) - {"lifecycle_violations"} - MODEL_METRICS)
                            | set(STORE_SUBMIT_DELAYS))
    assert metrics["store_submit_delay_steps_p50"] == 1  # stores are submitted the step after the write
    assert metrics["poisoned_loads"] == 0 and metrics["requests"] == 32 and metrics["crashes"] == 0
    assert metrics["copy_gb_per_s"] > 0  # the torch-copy worker's measured copies
    assert "engine vllm-scheduler" in capsys.readouterr().out


def test_run_with_a_connector_class_by_module_path(tmp_path):
    out = tmp_path / "ours.json"
    code = main(["run", "--engine", "vllm-scheduler", "--connector", "kvoffload.vllm.connector:KVOffloadConnector",
                 "--workload", "shared-prefix-small", "--preset", "vllm-0.29", "--quiet", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["connector"]["preset"] == "vllm-0.29"
    assert result["metrics"]["offload_hit_rate"] > 0
    assert result["metrics"]["lifecycle_violations"] == 0  # ours exposes its manager's strict mode


@pytest.mark.parametrize("argv, message", [
    (["--connector", "not a class"], "expects stock, reference, simple-cpu, simple-cpu-lazy, example, peer, MODULE:CLASS, or A+B"),
    (["--connector", "stock", "--preset", "vllm-0.29"], "not --connector stock"),
    (["--connector", "no_such_module:Thing"], "no module 'no_such_module' on the Python path"),
    (["--trace", "t.json"], "--trace needs the simulator"),
])
def test_bad_vllm_runs_are_one_line_errors(tmp_path, capsys, argv, message):
    code = main(["run", "--engine", "vllm-scheduler", "--workload", "shared-prefix-small", "--quiet",
                 "--out", str(tmp_path / "x.json"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()
