"""What a failing gate tells a maintainer, and what ``gate --update`` refuses to bless.

Hand-made baselines pin the rules (a flag's signature matched or not, a must-be-0 number blessed
or refused); the end-to-end story plants the issue's regression (the reference storing up to the
final token: ``final_token_watermark`` off) in a gate narrowed to spec-decode-small x the
reference, and reads what the gate prints and what ``--update`` does with it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvoffload import gate
from kvoffload.cli import main
from kvoffload.core.fixes import FIX_NAMES
from kvoffload.gate_signatures import Match, looks_like, poisoned_cells, replay_command
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import load_workload

REPO = Path(__file__).resolve().parents[2]


def _baseline(deterministic: dict, signatures: dict | None = None) -> dict:
    return {"schema": gate.SCHEMA, "commit": "abc", "machine": "m1", "deterministic": deterministic,
            "measured": {}, "signatures": signatures or {}}


# Two workloads, the reference's values, and two flags' signatures (the reference with the flag off):
# flag_a raises poisoned loads on w1 and lowers its hit rate; flag_b raises lifecycle violations on w2.
REFERENCE = {"w1/reference/poisoned_loads": 0.0, "w1/reference/hit_rate": 0.5,
             "w2/reference/poisoned_loads": 0.0, "w2/reference/lifecycle_violations": 0.0}
SIGNATURES = {"w1/final_token_watermark": {"poisoned_loads": 19.0, "hit_rate": 0.4},
              "w2/final_token_watermark": {},
              "w1/deferred_finish_signal": {}, "w2/deferred_finish_signal": {"lifecycle_violations": 3.0}}
SIGNATURES.update({f"{w}/{flag}": {} for w in ("w1", "w2") for flag in FIX_NAMES
                   if f"{w}/{flag}" not in SIGNATURES})


def test_moves_equal_to_a_flags_ablation_are_named_identical():
    now = {**REFERENCE, "w1/reference/poisoned_loads": 19.0, "w1/reference/hit_rate": 0.4}
    assert looks_like(_baseline(REFERENCE, SIGNATURES), now, ["w1", "w2"]) == [Match("final_token_watermark", True, ("w1",))]


def test_moves_the_same_way_by_other_amounts_only_look_like_the_flag():
    now = {**REFERENCE, "w1/reference/poisoned_loads": 7.0, "w1/reference/hit_rate": 0.45}
    assert looks_like(_baseline(REFERENCE, SIGNATURES), now, ["w1", "w2"]) == [Match("final_token_watermark", False, ("w1",))]


@pytest.mark.parametrize("moved, why", [
    ({"w1/reference/poisoned_loads": 19.0}, "the hit rate the flag also lowers did not move"),
    ({"w1/reference/poisoned_loads": 19.0, "w1/reference/hit_rate": 0.6}, "the hit rate went up, not down"),
    ({"w1/reference/poisoned_loads": 19.0, "w1/reference/hit_rate": 0.4, "w2/reference/poisoned_loads": 1.0},
     "w2 moved where the flag moves nothing"),
    ({}, "nothing moved"),
])
def test_other_moves_name_no_flag(moved, why):
    assert looks_like(_baseline(REFERENCE, SIGNATURES), {**REFERENCE, **moved}, ["w1", "w2"]) == [], why


def test_a_baseline_without_signatures_names_no_flag():
    """A baseline written before issue 29 (a git ref's) has none: the gate still compares."""
    now = {**REFERENCE, "w1/reference/poisoned_loads": 19.0, "w1/reference/hit_rate": 0.4}
    assert looks_like(_baseline(REFERENCE), now, ["w1", "w2"]) == []


def test_the_replay_command_names_the_workload_and_the_preset():
    assert replay_command("spec-decode-small/reference") == "kvoffload run --workload spec-decode-small"
    assert replay_command("multi-turn-small/vllm-0.26") == "kvoffload run --workload multi-turn-small --preset vllm-0.26"


def test_the_replay_command_gives_the_gates_numbers(monkeypatch, tmp_path):
    """What the gate prints reproduces the gate's run: every deterministic metric equal."""
    monkeypatch.setattr(gate, "WORKLOADS", ("multi-turn-small",))
    monkeypatch.setattr(gate, "CONNECTORS", ("vllm-0.26",))
    collected = gate.collect()["deterministic"]
    command = replay_command("multi-turn-small/vllm-0.26").split()
    assert main([*command[1:], "--quiet", "--out", str(tmp_path / "run.json")]) == 0
    metrics = json.loads((tmp_path / "run.json").read_text())["metrics"]
    prefix = "multi-turn-small/vllm-0.26/"
    assert {key[len(prefix):]: value for key, value in collected.items()} == {
        metric: gate._number(metrics.get(metric)) for metric in gate.DETERMINISTIC}


@pytest.mark.parametrize("key, value, refused", [
    ("w1/reference/poisoned_loads", 2.0, "must be 0 for the reference"),
    ("w1/vllm-0.30/poisoned_loads", 2.0, "must be 0: no fix flag vllm-0.30 lacks (none) raises it on w1"),
    # 0.29 lacks final_token_watermark, whose signature raises poisoned loads on w1 but not on w2
    ("w1/vllm-0.29/poisoned_loads", 19.0, None),
    ("w2/vllm-0.29/poisoned_loads", 19.0, "must be 0: no fix flag vllm-0.29 lacks (final_token_watermark) raises it on w2"),
    ("w2/vllm-0.26/lifecycle_violations", 3.0, None),  # 0.26 lacks deferred_finish_signal
    ("w1/reference/hit_rate", 0.1, None),  # not a must-be-0 metric
])
def test_a_must_be_0_number_is_blessed_only_where_a_missing_flag_explains_it(key, value, refused):
    cells = poisoned_cells({key: value}, SIGNATURES, None)
    assert [cell.why for cell in cells] == ([refused] if refused else [])


def test_a_preset_keeps_the_explanation_of_the_baseline_it_replaces():
    """A bug that makes final_token_watermark a no-op empties its new signature: vllm-0.29's 19
    poisoned loads are still the flag it lacks, as the replaced baseline's signature says."""
    emptied = {**SIGNATURES, "w1/final_token_watermark": {}}
    assert poisoned_cells({"w1/vllm-0.29/poisoned_loads": 19.0}, emptied, None) != []
    previous = {**_baseline({"w1/vllm-0.29/poisoned_loads": 19.0}), "signatures": SIGNATURES}
    assert poisoned_cells({"w1/vllm-0.29/poisoned_loads": 19.0}, emptied, previous) == []


def test_a_must_be_0_number_that_got_worse_is_refused_even_where_a_flag_explains_it():
    previous = _baseline({"w1/vllm-0.29/poisoned_loads": 19.0})
    assert poisoned_cells({"w1/vllm-0.29/poisoned_loads": 19.0}, SIGNATURES, previous) == []
    (cell,) = poisoned_cells({"w1/vllm-0.29/poisoned_loads": 20.0}, SIGNATURES, previous)
    assert cell.line() == "w1/vllm-0.29/poisoned_loads = 20: got worse (was 19 in the baseline it would replace)"


def test_a_flag_another_fix_hides_has_the_benchs_ablation_as_its_signature():
    """storable_within_allocated off alone moves nothing on aborts-and-resets-small (aborted_watermark
    stops every path to its bug); switched off after aborted_watermark, as the bench ablates it and
    as 0.25 and 0.26 run, the connector crashes. Its signature is that pair's, so vllm-0.26's crash
    there is the flags it lacks, not poison, and a match replays both flags off."""
    workload = "aborts-and-resets-small"
    alone = replay_workload(load_workload(workload), ConnectorChoice.build(None, ("storable_within_allocated",)))
    assert alone.result["metrics"]["crashes"] == 0
    signature = gate.ablation_metrics(workload, "storable_within_allocated")
    assert signature["crashes"] == 1
    signatures = {**SIGNATURES, f"{workload}/storable_within_allocated": {"crashes": signature["crashes"]}}
    assert poisoned_cells({f"{workload}/vllm-0.26/crashes": 1.0}, signatures, None) == []
    assert poisoned_cells({f"{workload}/vllm-0.29/crashes": 1.0}, signatures, None) != []  # 0.29 has both fixes
    assert Match("storable_within_allocated", True, (workload,)).sentence().endswith(
        f"kvoffload run --workload {workload} --disable-fix aborted_watermark --disable-fix storable_within_allocated")


def test_the_committed_baseline_blesses_no_poison_and_has_every_signature():
    document = json.loads((REPO / gate.BASELINE).read_text())
    assert "override" not in document
    assert set(document["signatures"]) == {f"{w}/{flag}" for w in gate.WORKLOADS for flag in FIX_NAMES}
    assert poisoned_cells(document["deterministic"], document["signatures"], None) == []


@pytest.fixture
def spec_decode_only(monkeypatch):
    monkeypatch.setattr(gate, "WORKLOADS", ("spec-decode-small",))
    monkeypatch.setattr(gate, "CONNECTORS", (None,))


def plant_final_token_watermark_off(monkeypatch):
    """The issue's regression: the reference stores up to num_tokens, as with the fix off (same label)."""
    build = ConnectorChoice.build

    def planted(preset=None, disabled=()):
        choice = build(preset, disabled)
        return dataclasses.replace(choice, fixes=choice.fixes.without("final_token_watermark"))

    monkeypatch.setattr(gate.ConnectorChoice, "build", staticmethod(planted))


def test_the_planted_regression_end_to_end(spec_decode_only, tmp_path, monkeypatch, capsys):
    path = tmp_path / "baseline.json"
    assert main(["gate", "--update", "--baseline", str(path), "--machine", "m1"]) == 0
    written = path.read_bytes()
    signature = json.loads(written)["signatures"]["spec-decode-small/final_token_watermark"]
    assert signature["poisoned_loads"] > 0  # the flag's ablation, computed from the code

    plant_final_token_watermark_off(monkeypatch)
    capsys.readouterr()
    assert main(["gate", "--baseline", str(path), "--machine", "m1"]) == 1
    out = capsys.readouterr().out
    assert "  spec-decode-small/reference (" in out and "poisoned_loads" in out
    assert "): kvoffload run --workload spec-decode-small\n" in out  # the replay of the moved cells
    assert "identical to `final_token_watermark` off" in out
    assert "kvoffload run --workload spec-decode-small --disable-fix final_token_watermark" in out
    assert "must-be-0 numbers got worse: a regression, which `kvoffload gate --update" in out

    # The remedy the gate used to print now refuses: nothing written, each number named.
    assert main(["gate", "--update", "--baseline", str(path), "--machine", "m1"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("kvoffload gate --update: refused;")
    assert "spec-decode-small/reference/poisoned_loads = " in out and "got worse (was 0 in the baseline" in out
    assert path.read_bytes() == written

    # A reviewed exception is recorded with its reason, and every later gate says so.
    assert main(["gate", "--update", "--baseline", str(path), "--machine", "m1",
                 "--override-reason", "planting a bug for the docs"]) == 0
    override = json.loads(path.read_text())["override"]
    assert override["reason"] == "planting a bug for the docs"
    assert any(line.startswith("spec-decode-small/reference/poisoned_loads = ") for line in override["cells"])
    capsys.readouterr()
    assert main(["gate", "--baseline", str(path), "--machine", "m1"]) == 0
    assert "blessed must-be-0 numbers on purpose: planting a bug for the docs" in capsys.readouterr().out


@pytest.mark.parametrize("args, said", [
    (["gate", "--override-reason", "x"], "--override-reason applies to --update"),
    (["gate", "--update", "--override-reason", " "], "--override-reason needs a reason"),
])
def test_an_override_needs_update_and_a_reason(args, said, capsys, monkeypatch):
    monkeypatch.setattr(gate, "collect", lambda repeats: pytest.fail("replayed before checking the flags"))
    assert main(args) == 2
    assert said in capsys.readouterr().err
