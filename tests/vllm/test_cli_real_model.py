"""``--engine vllm`` on the command line: bad input gets one line and exit 2 before any engine
starts (no vLLM needed for these)."""

from __future__ import annotations

import importlib.util

import pytest

from kvoffload.cli import main


@pytest.mark.parametrize("argv, message", [
    (["run", "--model", "m"], "--model needs --engine vllm"),
    (["run", "--no-oracle"], "--no-oracle needs --engine vllm"),
    (["run", "--connector", "off"], "--connector off needs --engine vllm"),
    (["run", "--engine", "vllm-scheduler", "--connector", "off"], "--connector off needs --engine vllm"),
    (["bench", "--model", "m"], "--model needs --engine vllm"),
    (["bench", "--workload", "multi-turn"], "--workload needs --engine vllm"),
    (["bench", "--engine", "vllm", "--workload", "multi"], "invalid choice: 'multi'"),
])
def test_real_model_flags_need_the_real_engine(argv, message, capsys, tmp_path):
    code = main(argv + ["--quiet"] + (["--out", str(tmp_path / "r.json")] if argv[0] == "run" else
                                      ["--out-dir", str(tmp_path)]))
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not any(tmp_path.iterdir())


def test_a_model_path_without_a_config_is_refused_before_the_engine_starts(capsys, tmp_path):
    code = main(["run", "--engine", "vllm", "--model", str(tmp_path), "--workload", "shared-prefix-small",
                 "--quiet", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and "no config.json there (a local model directory)" in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_real_engine_names_the_missing_extra(capsys, tmp_path):
    code = main(["run", "--engine", "vllm", "--workload", "shared-prefix-small", "--quiet",
                 "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and "--engine vllm needs vLLM" in err and "pip install 'kvoffload-bench[vllm]'" in err
