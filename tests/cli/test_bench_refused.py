"""kvoffload bench on a workload a preset refuses (``Fixes.model_refusal``, planted: every preset
replays every bundled model today, docs/hybrid.md). The refused rows of qwen3-next-multi-turn are in
the table as refused, with the reason under it and in the summary, and nothing is replayed or
written for them; the bench goes on with the other rows. The replays are stubbed with one real
outcome (the table and the files are what is under test)."""

from __future__ import annotations

import json

import kvoffload.cli.bench
from kvoffload.cli import main
from kvoffload.cli.bench import BENCH_CONNECTORS
from kvoffload.core.fixes import Fixes, MambaStores
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import load_workload

REASON = "planted: this preset's Mamba stores are not modelled"

def planted_refusal(self, model):
    """No preset refuses a bundled model any more (``Fixes.model_refusal``): the path is planted
    here, for the presets that store a Mamba group from its block table."""
    return REASON if model.has_mamba and self.rules.mamba_stores is MambaStores.BLOCK_TABLE else None


def test_the_presets_that_cannot_replay_a_mamba_group_are_rows_refused_with_the_reason(capsys, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setattr(Fixes, "model_refusal", planted_refusal)
    outcome = replay_workload(load_workload("qwen3-next-multi-turn-small"), ConnectorChoice.build())
    replayed = []

    def replay(workload, choice, **kwargs):
        replayed.append(choice.label)
        return outcome

    monkeypatch.setattr(kvoffload.cli.bench, "replay", replay)
    monkeypatch.setattr(kvoffload.cli.bench, "BENCH_WORKLOADS", ("multi-turn", "qwen3-next-multi-turn"))
    assert main(["bench", "--small", "--quiet", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    labels = [ConnectorChoice.build(preset, disabled).label for preset, disabled in BENCH_CONNECTORS]
    refused = ["vllm-0.25", "vllm-0.26", "vllm-0.28"]
    assert replayed == labels + [label for label in labels if label not in refused]
    summary = json.loads((tmp_path / "bench-summary-small.json").read_text())
    assert summary["refused"] == [{"workload": "qwen3-next-multi-turn-small", "connector": label,
                                   "reason": summary["refused"][0]["reason"]} for label in refused]
    assert summary["refused"][0]["reason"].startswith(REASON)
    assert [(row["workload"], row["connector"]) for row in summary["rows"]][len(labels):] == [
        ("qwen3-next-multi-turn-small", label) for label in labels if label not in refused]
    assert not list(tmp_path.glob("bench-qwen3-next-multi-turn-small-vllm-0.2[568].json"))
    # the table: each refused row in its place, in the plan's order, and the reasons under it
    table = [line.split() for line in out.splitlines() if line.startswith("qwen3-next-multi-turn-small ")]
    assert [cells[1] for cells in table if "[" not in cells[1]][-5:] == ["vllm-0.25", "vllm-0.26", "vllm-0.28",
                                                                          "vllm-0.29", "vllm-0.30"]
    assert [cells[2] for cells in table if cells[1] in refused] == ["refused"] * 3
    for label in refused:
        assert f"qwen3-next-multi-turn-small [{label}] refused: {REASON}" in out
