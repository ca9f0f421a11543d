"""kvoffload gate on a workload a preset refuses (``Fixes.model_refusal``, planted: every preset
replays every bundled model today): the gate runs of qwen3-next-multi-turn-small with vllm-0.25,
vllm-0.26 and vllm-0.28 have no numbers on either side, and the gate says so, with the reason, rather than crash
or drop them unsaid."""

from __future__ import annotations

import json

import pytest

from kvoffload import gate
from kvoffload.cli import main
from kvoffload.core.fixes import Fixes, MambaStores
from kvoffload.gate_baseline import write_baseline

REASON = "planted: this preset's Mamba stores are not modelled"


def planted_refusal(self, model):
    """No preset refuses a bundled model any more (``Fixes.model_refusal``): the path is planted
    here, for the presets that store a Mamba group from its block table."""
    return REASON if model.has_mamba and self.rules.mamba_stores is MambaStores.BLOCK_TABLE else None


@pytest.fixture(autouse=True)
def refusing(monkeypatch):
    monkeypatch.setattr(Fixes, "model_refusal", planted_refusal)


def test_no_preset_refuses_a_bundled_model(monkeypatch):
    monkeypatch.undo()
    assert gate.refused_runs() == {}


def test_the_gate_refuses_exactly_the_presets_that_cannot_replay_a_mamba_group():
    refused = gate.refused_runs()
    assert sorted(refused) == [f"qwen3-next-{kind}-small/vllm-0.2{minor}"
                               for kind in ("multi-turn", "spec-decode") for minor in (5, 6, 8)]
    assert all(REASON in reason for reason in refused.values())


def test_refused_runs_have_no_numbers_and_the_gate_names_them(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gate, "WORKLOADS", ("qwen3-next-multi-turn-small",))
    monkeypatch.setattr(gate, "CONNECTORS", (None, "vllm-0.25", "vllm-0.29"))
    collected = gate.collect(1)
    assert {key.rsplit("/", 1)[0] for key in collected["deterministic"]} == {
        "qwen3-next-multi-turn-small/reference", "qwen3-next-multi-turn-small/vllm-0.29"}
    path = tmp_path / "baseline.json"
    write_baseline(path, gate.baseline_document(collected, "m1", "abc"))
    assert main(["gate", "--baseline", str(path), "--machine", "m2"]) == 0
    out = capsys.readouterr().out
    assert f"qwen3-next-multi-turn-small/vllm-0.25: refused, no numbers ({REASON})" in out
    assert "vllm-0.29: refused" not in out and "kvoffload gate: pass" in out
    # a refused run that the baseline holds numbers for (a rule that changed) is missing: it fails
    document = json.loads(path.read_text())
    document["deterministic"]["qwen3-next-multi-turn-small/vllm-0.25/steps"] = 300.0
    write_baseline(path, document)
    assert main(["gate", "--baseline", str(path), "--machine", "m2"]) == 1
