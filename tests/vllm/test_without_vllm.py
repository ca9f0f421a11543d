"""Without the vllm extra the main suite still runs, and asking for vLLM says what is missing."""

from __future__ import annotations

import importlib.util

import pytest

from kvoffload.cli import main


def test_the_simulator_refuses_other_connectors(capsys, tmp_path):
    code = main(["run", "--connector", "stock", "--workload", "shared-prefix-small", "--quiet",
                 "--out", str(tmp_path / "x.json")])
    assert code == 2 and "needs --engine vllm-scheduler" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_engine_names_the_missing_extra(capsys, tmp_path):
    code = main(["run", "--engine", "vllm-scheduler", "--workload", "shared-prefix-small", "--quiet",
                 "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'kvoffload-bench[vllm]'" in err
