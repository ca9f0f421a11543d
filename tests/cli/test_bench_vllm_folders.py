"""``kvoffload bench --engine vllm-scheduler`` as docs/vllm.md runs it, then
``kvoffload report`` on what it wrote. The bench replays on two engines; report puts one engine's
runs of a workload on an axis and refuses two, so the bench writes out/runs-ENGINE/, each engine's
runs in a folder of their own, and the simulator's out/runs/ stays as it was. The vLLM replays
are stood in for by simulator outcomes relabelled with the engine (no vLLM here); the folders and
what report makes of them are under test."""

from __future__ import annotations

import copy
import dataclasses

import pytest

import kvoffload.cli.bench
from kvoffload.cli import main
from kvoffload.engines import ENGINES, SIMULATOR
from kvoffload.runner import replay_workload


@pytest.fixture
def stand_in_engines(monkeypatch):
    outcomes = {}

    def replay(workload, choice, quiet, position="", engine=SIMULATOR, **kwargs):
        if workload.name not in outcomes:
            outcomes[workload.name] = replay_workload(workload, choice)
        outcome = outcomes[workload.name]
        result = copy.deepcopy(outcome.result)
        result["config"].update(engine=engine, connector=choice.source)
        result["connector"]["label"] = choice.label
        return dataclasses.replace(outcome, result=result)

    monkeypatch.setattr(kvoffload.cli.bench, "replay", replay)


def test_each_engine_benches_into_its_own_folder_by_default():
    from kvoffload.cli.bench_folders import default_out_dir

    assert default_out_dir(SIMULATOR).as_posix() == "out/runs"
    assert {engine: default_out_dir(engine).as_posix() for engine in ENGINES if engine != SIMULATOR} == {
        "vllm-scheduler": "out/runs-vllm-scheduler", "vllm": "out/runs-vllm"}


WORKLOADS = ("aborts-and-resets", "gpt-oss-multi-turn", "gpt-oss-spec-decode", "multi-turn", "qwen3-next-multi-turn",
             "qwen3-next-spec-decode", "shared-prefix", "spec-decode")  # kvoffload bench's, sorted


def test_the_vllm_scheduler_bench_leaves_a_folder_report_draws(stand_in_engines, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "runs").mkdir(parents=True)  # the simulator's bench was here first
    (tmp_path / "out" / "runs" / "bench-summary.json").write_text("{}")
    assert main(["bench", "--engine", "vllm-scheduler", "--quiet"]) == 0
    printed = capsys.readouterr().out
    root = tmp_path / "out" / "runs-vllm-scheduler"
    assert sorted(p.name for p in root.iterdir()) == ["bench-summary-vllm.json", "simulator", "vllm-scheduler"]
    assert sorted(p.name for p in (root / "vllm-scheduler").iterdir()) == [
        f"bench-{w}-small-{c}-vllm-scheduler.json" for w in WORKLOADS for c in ("reference", "vllm-stock")]
    assert sorted(p.name for p in (root / "simulator").iterdir()) == [f"bench-{w}-small-reference.json" for w in WORKLOADS]
    assert [p.name for p in (tmp_path / "out" / "runs").iterdir()] == ["bench-summary.json"]

    # the command the bench prints draws the charts
    hint = "kvoffload report --from out/runs-vllm-scheduler/vllm-scheduler --out out/runs-vllm-scheduler/charts"
    assert hint in printed
    assert main(hint.split()[1:]) == 0
    assert (root / "charts" / "index.html").is_file()
    assert main(["report", "--from", "out/runs-vllm-scheduler/simulator", "--out", "out/charts-sim"]) == 0
    # the whole folder holds two engines' runs of each workload: report refuses it, in one line
    capsys.readouterr()
    assert main(["report", "--from", "out/runs-vllm-scheduler", "--out", "out/charts-both"]) == 2
    assert "on different engines" in capsys.readouterr().err
