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
from kvoffload.results import git_commit
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
    moved = [line.split() for line in out.splitlines() if " moved " in line]
    assert ["multi-turn-small/reference", "last_block_hit_rate"] in [line[:2] for line in moved]
    # each change labelled by the glossary's direction: a hit rate that dropped is worse
    assert [line[-1] for line in moved if line[1] == "last_block_hit_rate"] == ["worse"]
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


def test_each_change_is_labelled_by_the_glossarys_direction():
    base = _baseline({"w/c/poisoned_loads": 0.0, "w/c/gpu_hit_rate": 0.5, "w/c/steps": 100.0,
                      "w/c/store_visible_delay_steps_p99": 4.0})
    now = {"deterministic": {"w/c/poisoned_loads": 3.0, "w/c/gpu_hit_rate": 0.6, "w/c/steps": 90.0,
                             "w/c/store_visible_delay_steps_p99": 5.0}, "measured": {}}
    directions = {row.metric: row.direction for row in gate.compare(base, now, "m1")}
    assert directions == {"poisoned_loads": "worse", "gpu_hit_rate": "better", "steps": "info",
                          "store_visible_delay_steps_p99": "worse"}


def test_a_measured_metric_that_appears_or_disappears_fails_on_any_machine():
    entry = {"median": 10.0, "min": 9.0, "max": 11.0, "repeats": 3}
    base = _baseline({}, {"w/c/connector_us_per_step": entry, "w/c/copy_gb_per_s": entry}, machine="elsewhere")
    now = {"deterministic": {}, "measured": {"w/c/connector_us_per_step": [10.0], "w/c/sim_requests_per_s": [5.0]}}
    rows = gate.compare(base, now, "here")
    assert {(r.metric, r.verdict) for r in rows} == {("connector_us_per_step", "not compared"),
                                                      ("copy_gb_per_s", "missing"), ("sim_requests_per_s", "new")}
    assert {r.metric for r in gate.failures(rows, strict=False)} == {"copy_gb_per_s", "sim_requests_per_s"}


def test_a_metric_added_to_the_glossary_fails_the_gate_until_the_baseline_is_regenerated(
        one_run, tmp_path, monkeypatch, capsys):
    """The baseline was written before the glossary had gpu_hit_rate; now it has it: the gate
    names the new number, fails, and prints the exact command that regenerates this baseline."""
    path = tmp_path / "baseline.json"
    monkeypatch.setattr(gate, "DETERMINISTIC", tuple(m for m in gate.DETERMINISTIC if m != "gpu_hit_rate"))
    assert main(["gate", "--update", "--baseline", str(path), "--machine", "ci-box", "--repeats", "2"]) == 0
    monkeypatch.undo()
    monkeypatch.setattr(gate, "WORKLOADS", ("multi-turn-small",))
    monkeypatch.setattr(gate, "CONNECTORS", (None,))
    capsys.readouterr()
    assert main(["gate", "--baseline", str(path), "--machine", "ci-box"]) == 1
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("multi-turn-small/")
            and " new " in line] == [["multi-turn-small/reference", "gpu_hit_rate"]]
    assert f"`kvoffload gate --update --machine ci-box --repeats 2 --baseline {path}`" in out
    # and the other way: a metric the glossary lost
    monkeypatch.setattr(gate, "DETERMINISTIC", tuple(m for m in gate.DETERMINISTIC if m != "steps"))
    assert main(["gate", "--baseline", str(path), "--machine", "ci-box"]) == 1
    assert ["multi-turn-small/reference", "steps"] in [
        line.split()[:2] for line in capsys.readouterr().out.splitlines() if " missing " in line]


@pytest.mark.parametrize("fmt", ["json", "csv", "markdown"])
def test_the_gate_writes_each_format(monkeypatch, capsys, tmp_path, fmt):
    """The same rows in every format; json also carries the verdict and the update command."""
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(_baseline({"w/reference/poisoned_loads": 0.0}, machine="box")))
    monkeypatch.setattr(gate, "collect", lambda repeats: {"deterministic": {"w/reference/poisoned_loads": 2.0},
                                                           "measured": {}})
    assert main(["gate", "--baseline", str(path), "--machine", "box", "--format", fmt]) == 1
    out = capsys.readouterr().out
    if fmt == "json":
        document = json.loads(out)
        assert document["passed"] is False
        assert document["update_command"] == f"kvoffload gate --update --machine box --repeats 1 --baseline {path}"
        assert document["rows"] == [{"run": "w/reference", "metric": "poisoned_loads", "baseline": 0.0, "now": 2.0,
                                     "change": 2.0, "verdict": "moved", "direction": "worse",
                                     "replay": "kvoffload run --workload w"}]
    elif fmt == "csv":
        assert out.splitlines() == ["run,metric,baseline,now,change,verdict,direction,replay",
                                    "w/reference,poisoned_loads,0.0,2.0,2.0,moved,worse,kvoffload run --workload w"]
    else:
        assert "| w/reference | poisoned_loads | 0 | 2 | +2 | moved | worse | kvoffload run --workload w |" in out
        assert "kvoffload gate: FAIL" in out


@pytest.fixture
def no_replay(monkeypatch):
    """Any replay fails the test: what is checked here must be checked before the replays."""
    def replayed(repeats):
        raise AssertionError("the gate replayed before checking its input")
    monkeypatch.setattr(gate, "collect", replayed)


@pytest.mark.parametrize("body, reason", [
    ({"deterministic": {"w/c/poisoned_loads": "zero"}, "measured": {}}, "deterministic.w/c/poisoned_loads"),
    ({"deterministic": [], "measured": {}}, "deterministic: expected an object"),
    ({"deterministic": {"poisoned_loads": 0}, "measured": {}}, "workload/connector/metric"),
    ({"deterministic": {}, "measured": {"w/c/connector_us_per_step": {"median": 1.0}}}, ".min: expected a finite"),
    ({"deterministic": {}, "measured": {"w/c/connector_us_per_step": 5}}, "expected an object with median"),
    ({"deterministic": {}, "measured": {}, "machine": 7}, "machine: expected a string"),
    ({"deterministic": {"w/c/steps": 10 ** 400}, "measured": {}}, "deterministic.w/c/steps"),
])
def test_a_malformed_baseline_body_is_bad_input_before_any_replay(no_replay, tmp_path, capsys, body, reason):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"schema": gate.SCHEMA, **body}))
    assert main(["gate", "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a gate baseline" in err[0] and reason in err[0]


@pytest.mark.parametrize("value, shown", [("zero", "'zero'"), ("z" * 60, "'" + "z" * 36 + "...")])
def test_the_offending_value_is_quoted_whole_when_short_and_cut_to_40_characters_when_long(
        no_replay, tmp_path, capsys, value, shown):
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"schema": gate.SCHEMA, "deterministic": {"w/c/steps": value}, "measured": {}}))
    assert main(["gate", "--baseline", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"expected a number or null, got {shown})")


def test_the_table_aligns_baseline_now_and_change_to_the_right():
    rows = [gate.Row("w/reference", "poisoned_loads", 0.0, 2.0, "moved"),
            gate.Row("w/reference", "steps", 1000.0, 12.0, "moved")]
    assert gate.format_table(rows, "markdown").splitlines()[1] == "|---|---|---:|---:|---:|---|---|"
    text = gate.format_table(rows).splitlines()
    assert text[2].endswith("poisoned_loads         0    2             +2  moved    worse")
    assert text[3].endswith("steps               1000   12  -988 (-98.8%)  moved    info")


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing folder"])
def test_update_refuses_a_target_it_cannot_write_before_any_replay(no_replay, tmp_path, capsys, kind):
    import os

    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    else:
        target = tmp_path / "no" / "such" / "baseline.json"
        (tmp_path / "no").write_text("a file where a folder should be")
    assert main(["gate", "--update", "--baseline", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvoffload: error: --baseline {target}") and len(err.splitlines()) == 1


def test_a_baseline_that_looks_like_an_option_never_reaches_git_as_one(no_replay, tmp_path, capsys, monkeypatch):
    """``git show --output=F`` creates F (even when it then fails): handed to git as it was typed,
    ``--baseline=--output=w`` would create ``w:results/gate/baseline.json`` here. The user's string
    is a revision after --end-of-options, or nothing."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    target = tmp_path / "w:results" / "gate"
    target.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for spec in ("--output=w", "-p", "--output=w^{commit}"):
        assert main(["gate", f"--baseline={spec}"]) == 2
        assert "neither a file nor a git ref" in capsys.readouterr().err
    assert list(target.iterdir()) == []


def test_a_git_ref_reads_the_baseline_committed_there(tmp_path, capsys, monkeypatch):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results" / "gate").mkdir(parents=True)
    (tmp_path / "results" / "gate" / "baseline.json").write_text(json.dumps(_baseline({"w/c/steps": 7.0})))
    git("add", "results")
    git("commit", "-q", "-m", "baseline")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gate, "collect", lambda repeats: {"deterministic": {"w/c/steps": 7.0}, "measured": {}})
    assert main(["gate", "--baseline", "HEAD"]) == 0
    assert "baseline: HEAD:results/gate/baseline.json" in capsys.readouterr().out


def test_a_number_on_one_side_only_shows_n_a_for_the_other(capsys):
    """The text table of a metric that appeared and one that disappeared: each number where it
    exists, ``n/a`` where it does not, and no change computed across the gap."""
    base = _baseline({"w/c/gone": 1.5})
    rows = gate.compare(base, {"deterministic": {"w/c/added": 0.25}, "measured": {}}, "m1")
    shown = {line.split()[1]: line.split()[2:5] for line in gate.format_table(rows).splitlines()
             if line.startswith("w/c ")}
    assert shown == {"added": ["n/a", "0.25", "-"], "gone": ["1.5", "n/a", "-"]}


def test_the_machine_is_the_flag_then_the_environment_then_the_host_name(monkeypatch):
    monkeypatch.setattr(gate.platform, "node", lambda: "host-7")
    monkeypatch.delenv("KVOFFLOAD_MACHINE", raising=False)
    assert gate.machine_name() == "host-7"
    monkeypatch.setenv("KVOFFLOAD_MACHINE", "ci-box")
    assert gate.machine_name() == "ci-box"
    assert gate.machine_name("laptop") == "laptop"
    monkeypatch.delenv("KVOFFLOAD_MACHINE")
    monkeypatch.setattr(gate.platform, "node", lambda: "")  # a host without a name
    assert gate.machine_name() == "unknown"


def test_update_without_a_baseline_rewrites_the_trees_own_and_records_no_commit_outside_git(
        tmp_path, monkeypatch):
    """``kvoffload gate --update`` with no --baseline writes ``results/gate/baseline.json`` under
    the tree's root. The baseline's commit is the tree's HEAD; outside a git checkout (git fails)
    or where git is not installed (it cannot start), there is none, and the update still works."""
    monkeypatch.setattr(gate, "collect", lambda repeats: {"deterministic": {"w/reference/steps": 7.0},
                                                           "measured": {}})
    (tmp_path / "results" / "gate").mkdir(parents=True)
    said = []
    assert gate.run_gate(baseline=None, update=True, strict=False, machine="m1", repeats=1, root=tmp_path,
                         echo=said.append) == 0
    document = json.loads((tmp_path / gate.BASELINE).read_text())
    assert (document["commit"], document["deterministic"]) == (None, {"w/reference/steps": 7.0})
    assert said[0].startswith(f"gate baseline written: {tmp_path / gate.BASELINE} (1 deterministic numbers")

    monkeypatch.setenv("PATH", str(tmp_path / "no-programs-here"))
    assert git_commit(tmp_path) is None


@pytest.mark.parametrize("schema", ["kvoffload-bench/gate-baseline/v2", "kvoffload-bench/gate-baseline/v0", None])
def test_a_baseline_of_another_schema_is_refused_even_when_its_body_reads_as_v1(no_replay, tmp_path, capsys, schema):
    """A later (or earlier) version of the file may mean other things by the same fields: the
    schema is checked for equality before the body is read, and a file without one is refused too."""
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({**_baseline({"w/c/steps": 7.0}), "schema": schema}))
    assert main(["gate", "--baseline", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kvoffload: error: {path}: not a gate baseline (schema {gate.SCHEMA!r} expected)"]
