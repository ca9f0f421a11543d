"""kvoffload gate: a deterministic number that moves fails with a table naming it; measured numbers
are compared only on the baseline's machine and fail only with --strict; bad baselines are bad input.

The end-to-end stories replay one -small workload through the reference only (the gate's run list
is narrowed with monkeypatch) and plant a real regression: the reference with a fix switched off.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvoffload import gate
from kvoffload.cli import main
from kvoffload.runner import ConnectorChoice


def _baseline(deterministic: dict, measured: dict | None = None, machine: str = "m1") -> dict:
    return {"schema": gate.SCHEMA, "commit": "abc", "machine": machine, "deterministic": deterministic,
            "measured": measured or {}}


def test_a_deterministic_number_that_moves_is_named_and_fails():
    base = _baseline({"w/reference/poisoned_loads": 0.0, "w/reference/last_block_hit_rate": 1.0})
    now = {"deterministic": {"w/reference/poisoned_loads": 2.0, "w/reference/last_block_hit_rate": 1.0},
           "measured": {}}
    rows = gate.compare(base, now, "m1")
    assert [(r.run, r.metric, r.baseline, r.now, r.verdict) for r in rows] == [
        ("w/reference", "poisoned_loads", 0.0, 2.0, "moved")]
    assert gate.failures(rows, strict=False) == rows
    table = gate.format_table(rows)
    assert "poisoned_loads" in table and "moved" in table and "+2" in table


def test_an_improvement_fails_too_until_the_baseline_is_regenerated():
    base = _baseline({"w/reference/last_block_hit_rate": 0.5})
    rows = gate.compare(base, {"deterministic": {"w/reference/last_block_hit_rate": 0.75}, "measured": {}}, "m1")
    assert [r.verdict for r in rows] == ["moved"]


def test_float_noise_is_within_tolerance_but_a_real_change_is_not():
    base = _baseline({"w/c/tokens_per_s_modeled": 1234.5})
    same = {"deterministic": {"w/c/tokens_per_s_modeled": 1234.5 * (1 + 1e-12)}, "measured": {}}
    tiny = {"deterministic": {"w/c/tokens_per_s_modeled": 1234.5 * (1 + 1e-6)}, "measured": {}}
    assert gate.compare(base, same, "m1") == []
    assert [r.verdict for r in gate.compare(base, tiny, "m1")] == ["moved"]


def test_a_value_that_appears_or_disappears_fails():
    base = _baseline({"w/c/store_submit_delay_steps_p50": None, "w/c/gone": 1.0})
    now = {"deterministic": {"w/c/store_submit_delay_steps_p50": 3.0, "w/c/added": 0.0}, "measured": {}}
    verdicts = {(r.metric, r.verdict) for r in gate.compare(base, now, "m1")}
    assert verdicts == {("store_submit_delay_steps_p50", "moved"), ("gone", "missing"), ("added", "new")}


def test_measured_numbers_compare_only_on_the_same_machine_and_fail_only_when_strict():
    entry = {"median": 100.0, "min": 90.0, "max": 110.0, "repeats": 3}
    base = _baseline({}, {"w/c/connector_us_per_step": entry, "w/c/sim_requests_per_s": entry})
    now = {"deterministic": {}, "measured": {"w/c/connector_us_per_step": [400.0], "w/c/sim_requests_per_s": [90.0]}}
    rows = {r.metric: r for r in gate.compare(base, now, "m1")}
    assert rows["connector_us_per_step"].verdict == "slower"  # 4x the µs: beyond x1.5
    assert rows["sim_requests_per_s"].verdict == "ok"  # a 10 % drop in requests/s: within x1.5
    assert gate.failures(rows.values(), strict=False) == []
    assert [r.metric for r in gate.failures(rows.values(), strict=True)] == ["connector_us_per_step"]
    elsewhere = gate.compare(base, now, "m2")
    assert {r.verdict for r in elsewhere} == {"not compared"}


def test_a_noisy_baseline_allows_more_room():
    assert gate.allowed_factor({"min": 100.0, "max": 101.0}) == gate.MEASURED_FLOOR_FACTOR
    assert gate.allowed_factor({"min": 100.0, "max": 200.0}) == pytest.approx(4.0)


@pytest.fixture
def one_run(monkeypatch):
    """The gate narrowed to multi-turn-small x the reference (one replay per collect)."""
    monkeypatch.setattr(gate, "WORKLOADS", ("multi-turn-small",))
    monkeypatch.setattr(gate, "CONNECTORS", (None,))


def test_update_then_gate_passes_and_the_file_is_one_number_per_line(one_run, tmp_path, capsys):
    path = tmp_path / "baseline.json"
    assert main(["gate", "--update", "--baseline", str(path), "--machine", "m1"]) == 0
    document = json.loads(path.read_text())
    assert document["workloads"] == ["multi-turn-small"] and document["connectors"] == ["reference"]
    keys = list(document["deterministic"])
    assert keys == sorted(keys) and "multi-turn-small/reference/last_block_hit_rate" in keys
    lines = path.read_text().splitlines()
    assert any(line.strip().startswith('"multi-turn-small/reference/poisoned_loads": 0') for line in lines)
    capsys.readouterr()
    assert main(["gate", "--baseline", str(path), "--machine", "m2"]) == 0
    out = capsys.readouterr().out
    assert "0 moved" in out and "measured: not compared" in out and "kvoffload gate: pass" in out


def test_a_fix_switched_off_in_the_reference_fails_the_gate(one_run, tmp_path, monkeypatch, capsys):
    """The planted regression: the reference loses last_block_at_finish (the fix vLLM 0.25 lacks)."""
    path = tmp_path / "baseline.json"
    assert main(["gate", "--update", "--baseline", str(path)]) == 0
    build = ConnectorChoice.build

    def without_the_fix(preset=None, disabled=()):
        """As if the fix's default were off: the same label, the fix missing."""
        choice = build(preset, disabled)
        return dataclasses.replace(choice, fixes=choice.fixes.without("last_block_at_finish"))

    monkeypatch.setattr(gate.ConnectorChoice, "build", staticmethod(without_the_fix))
    capsys.readouterr()
    assert main(["gate", "--baseline", str(path)]) == 1
    out = capsys.readouterr().out
    moved = [line for line in out.splitlines() if line.endswith("moved")]
    assert any(line.startswith("multi-turn-small/reference") and "last_block_hit_rate" in line for line in moved)
    assert "kvoffload gate: FAIL" in out


@pytest.mark.parametrize("content, reason", [
    ("not json", "not JSON"),
    ('{"schema": "something else"}', "not a gate baseline"),
])
def test_a_bad_baseline_is_bad_input(tmp_path, capsys, content, reason):
    path = tmp_path / "baseline.json"
    path.write_text(content)
    assert main(["gate", "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0]


def test_a_missing_baseline_or_unknown_ref_is_bad_input(tmp_path, capsys):
    assert main(["gate", "--baseline", "no-such-ref-or-file"]) == 2
    assert "neither a file nor a git ref" in capsys.readouterr().err
    assert main(["gate", "--repeats", "0"]) == 2
    assert "--repeats" in capsys.readouterr().err
