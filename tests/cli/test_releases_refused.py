"""``kvoffload releases`` on a workload a preset cannot replay (``Fixes.model_refusal``, planted:
every preset replays every bundled model today, docs/hybrid.md). The release's stock connector
still runs, so its row keeps the release's side and says why nothing stands beside it; no second
pass is asked for; a second pass the release's scheduler refused says why it was not run."""

from __future__ import annotations

import pytest

from kvoffload.cli.releases import _table
from kvoffload.core.fixes import Fixes, MambaStores
from kvoffload.releases import SimulatorRow, compare, needs_second_pass, releases_markdown, simulator_row

WORKLOAD = "qwen3-next-multi-turn-small"
REASON = "planted: this preset's Mamba stores are not modelled"

def planted_refusal(self, model):
    """No preset refuses a bundled model any more (``Fixes.model_refusal``): the path is planted
    here, for the presets that store a Mamba group from its block table."""
    return REASON if model.has_mamba and self.rules.mamba_stores is MambaStores.BLOCK_TABLE else None


def release_row(first, metrics=None):
    return {"workload": WORKLOAD, "scheduling": "sync", "first_admission": first, "error": None, "leaked": [],
            "metrics": metrics or {"poisoned_loads": 0, "crashes": 1, "offload_hit_rate": 0.616}, "seconds": 3.0}


@pytest.mark.parametrize("preset", ["vllm-0.25", "vllm-0.26"])
def test_the_simulator_row_of_a_refusing_preset_is_its_reason_not_a_crash(preset, monkeypatch):
    monkeypatch.setattr(Fixes, "model_refusal", planted_refusal)
    row = simulator_row(WORKLOAD, "sync", preset)
    assert row.refused.startswith(REASON) and row.metrics == {} and row.first_admission == {}


@pytest.mark.parametrize("preset", ["vllm-0.25", "vllm-0.29"])
def test_the_presets_replay_it(preset):
    """0.25's stores a Mamba group from its block table, 0.29's from the hand-off (docs/hybrid.md)."""
    row = simulator_row(WORKLOAD, "sync", preset)
    assert row.refused is None and row.first_admission and row.metrics["requests"] == 53
    assert row.metrics["poisoned_loads"] == 0 and row.metrics["offload_hit_rate"] > 0


def test_a_refused_preset_leaves_the_releases_side_and_the_reason():
    refused = SimulatorRow({}, None, {}, refused=REASON)
    row = compare(release_row({"a": [16, 0], "b": [0, 32], "c": [8, 8]}), refused)
    assert row["preset_refused"] == REASON and "agree" not in row and "agreeing" not in row
    assert row["release_requests"] == 3
    assert row["totals"] == {"release": {"gpu_hit_tokens": 24, "connector_hit_tokens": 40}}
    assert row["release"]["metrics"]["crashes"] == 1 and row["preset"] == {"metrics": {}, "error": None}
    assert not needs_second_pass(row)  # the reference is refused in 0.25-0.28's schedulers too
    (line,) = releases_markdown({"releases": [{"release": "0.26.0", "preset": "vllm-0.26",
                                               "rows": [row]}]}).splitlines()[2:]
    assert line.startswith(f"| 0.26.0 | vllm-0.26 | {WORKLOAD} | sync | 3 requests, the preset refused | 24 | 40 "
                           "| 0 | 1 | - | - | 0.616 |")
    assert line.endswith(f"| refused: {REASON} |")
    assert line.count("|") == 16  # the table's 15 columns
    printed = _table([{"release": "0.26.0", "preset": "vllm-0.26", "seconds": 3.0, "rows": [row]}])
    assert f"the release's row only; vllm-0.26 refused: {REASON}" in printed


def test_a_second_pass_the_releases_scheduler_refused_says_why_it_was_not_run():
    hits = {"a": [16, 0], "b": [0, 32]}
    row = compare(release_row(hits), SimulatorRow({"poisoned_loads": 0, "crashes": 0}, None, {"a": [16, 0],
                                                                                                "b": [0, 16]}))
    assert needs_second_pass(row)
    row["preset_in_release_scheduler"] = {"setup_error": "ConfigError: KVOffloadConnector: model 'qwen3-next'"}
    (line,) = releases_markdown({"releases": [{"release": "0.27.0", "preset": "vllm-0.29",
                                               "rows": [row]}]}).splitlines()[2:]
    assert line.endswith("| not run: ConfigError: KVOffloadConnector: model 'qwen3-next' |")
    printed = _table([{"release": "0.27.0", "preset": "vllm-0.29", "seconds": 3.0, "rows": [row]}])
    assert "the preset in vLLM 0.27.0's own scheduler: not run: ConfigError" in printed
