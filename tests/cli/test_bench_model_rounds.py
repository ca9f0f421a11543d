"""``kvoffload bench --engine vllm`` runs every real-model connector three times, interleaved round
by round, after one discarded warm-up, and keeps every round. The real engine is stood in for by
simulator outcomes relabelled with their connector, their wall times made up per round (no vLLM
here); what the bench does with the rounds is under test."""

from __future__ import annotations

import copy
import dataclasses
import json
import signal

import pytest

import kvoffload.cli.bench_model as bench_model
from kvoffload.choice import ConnectorChoice, check_source
from kvoffload.core.types import ConfigError
from kvoffload.engines import SIMULATOR, VLLM
from kvoffload.runner import replay_workload
from kvoffload.workloads import load_workload


@pytest.fixture
def stand_in(monkeypatch):
    """Every replay, in call order: (engine, label, max_steps, oracle option)."""
    calls, base = [], {}

    def replay(workload, choice, quiet, position="", engine=SIMULATOR, max_steps=None, engine_options=None, **_):
        calls.append((engine, choice.label, max_steps, (engine_options or {}).get("oracle")))
        if workload.name not in base:
            base[workload.name] = replay_workload(workload, ConnectorChoice.build())
        outcome = base[workload.name]
        result = copy.deepcopy(outcome.result)
        result["connector"]["label"] = choice.label
        result["metrics"]["output_tokens_per_s"] = float(len(calls))  # a different wall time every run
        if engine == VLLM and choice.source != "off":
            result["oracle"] = {"identical": 32, "compared": 32, "mismatches": [], "not_compared": [],
                                "first_n_logprobs": 8, "logprob_tolerance": 1e-3, "max_logprob_delta": 0.0}
        return dataclasses.replace(outcome, result=result)

    monkeypatch.setattr(bench_model, "replay", replay)
    return calls


CONNECTORS = ["off", "vllm-stock", "reference", "reference -final_token_watermark"]


def test_every_connector_runs_three_times_interleaved_after_one_warm_up(stand_in, tmp_path):
    rows, oracles = bench_model.run_model_bench([load_workload("shared-prefix-small")], tmp_path, True, None)
    warm_up, simulator, *measured = stand_in
    assert warm_up == (VLLM, "off", bench_model.WARM_UP_STEPS, False)  # discarded, no oracle run
    assert simulator == (SIMULATOR, "reference", None, None)  # deterministic: once
    assert [(engine, label) for engine, label, _, _ in measured] == [(VLLM, label) for _ in range(3)
                                                                      for label in CONNECTORS]
    assert all(oracle is True for _, _, _, oracle in measured)
    assert [(label, len(rounds)) for _, label, rounds, _ in rows] == [("sim reference", 1)] + [
        (label, 3) for label in CONNECTORS]
    # the reference's rounds are runs 5, 9 and 13 of the 14 calls
    assert [m["output_tokens_per_s"] for m in rows[3][2]] == [5.0, 9.0, 13.0]
    assert [len(checked) for checked in oracles.values()] == [3, 3, 3]
    # each result file is round 1's run, with every round's metrics
    written = json.loads((tmp_path / "vllm" / "bench-shared-prefix-small-reference-vllm.json").read_text())
    assert written["metrics"]["output_tokens_per_s"] == 5.0
    assert [m["output_tokens_per_s"] for m in written["rounds"]] == [5.0, 9.0, 13.0]


def test_the_command_writes_every_round_and_fails_on_a_mismatch_of_a_sound_connector(stand_in, tmp_path, monkeypatch,
                                                                                      capsys):
    import kvoffload.vllm.pinned as pinned

    monkeypatch.setattr(pinned, "call_pinned", lambda function, *args, **_: function(*args))
    args = type("Args", (), {"quiet": True, "model": None})()
    assert bench_model.cmd_model_bench(args, [load_workload("shared-prefix-small")], tmp_path) == 0
    summary = json.loads((tmp_path / "bench-summary-engine-vllm.json").read_text())
    assert summary["rounds"] == 3 and [len(row["rounds"]) for row in summary["rows"]] == [1, 3, 3, 3, 3]
    out = capsys.readouterr()
    assert "13 runs (3 of each real-model connector, interleaved)" in out.out and out.err == ""

    original = bench_model.replay

    def one_mismatch(workload, choice, *args, **kwargs):
        outcome = original(workload, choice, *args, **kwargs)
        if choice.label == "reference" and "oracle" in outcome.result:
            outcome.result["oracle"]["mismatches"] = ["req-3"]
        return outcome

    monkeypatch.setattr(bench_model, "replay", one_mismatch)
    assert bench_model.cmd_model_bench(args, [load_workload("shared-prefix-small")], tmp_path / "again") == 1
    assert capsys.readouterr().err.splitlines() == [
        "kvoffload: shared-prefix-small [reference]: outputs differ from the offload-off run"]


def test_equal_measured_values_from_separate_runs_show_once():
    """Three runs' equal floats are three objects: compared by value, shown as one number."""
    rounds = [{"ttft_ms_p50": float(text)} for text in ("4e1", "40.0", "4.0e1")]
    assert bench_model.spread_cell("ttft_ms_p50", rounds) == "40.00"


def test_a_connector_class_needs_a_module_and_a_class():
    for bad in (":Conn", "mod:", "a:b:c", "mod"):
        with pytest.raises(ConfigError):
            check_source(bad)
    check_source("tests.vllm.broken_connector:Broken")


def test_a_command_run_in_process_leaves_ctrl_c_as_it_was():
    """The console script ignores a late Ctrl-C; a caller's own process (a test, a notebook) keeps its handler."""
    from kvoffload.cli import main

    before = signal.getsignal(signal.SIGINT)
    main(["fixes"])
    assert signal.getsignal(signal.SIGINT) is before
