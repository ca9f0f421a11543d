"""``kvoffload releases``: each real release's rows beside its preset's. The releases themselves
run only where their venvs exist (scripts/setup-vllm VERSION); here a stand-in release venv
replays the preset in the simulator and changes one request, so the comparison and the
subprocess plumbing are checked without vLLM."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.cli import releases as releases_cli
from release_venvs import stand_in_venv
from kvoffload.results import locked_folder
from kvoffload.releases import (SimulatorRow, compare, needs_second_pass, preset_inside, releases_markdown,
                                venv_name)

REPO = Path(__file__).resolve().parents[2]

# What the stand-in "release" runs: the preset's own replay, with its first request that had
# connector hits admitted with one token less; with --preset (the reference with the preset in the
# release's scheduler) the same, as when a release's scheduler, not its connector, differs.
STAND_IN = """
import json, os, sys
from kvoffload.releases import simulator_row
jobs = sys.argv[3:]
if jobs[0] == "--preset":
    assert jobs[1] == "vllm-0.29", jobs
    jobs = jobs[2:]
for job in jobs:
    name, _, scheduling = job.partition(":")
    sim = simulator_row(name, scheduling, "vllm-0.29")
    first = dict(sim.first_admission)
    victim = sorted(r for r, hits in first.items() if hits[1])[0]
    first[victim] = [first[victim][0], first[victim][1] - 1]
    print(json.dumps({"release": "0.29.0", "workload": name, "scheduling": scheduling,
                      "hash_seed": os.environ.get("PYTHONHASHSEED"), "metrics": sim.metrics, "error": None,
                      "leaked": [], "stuck": [], "first_admission": first, "victim": victim}))
"""


def release_row(first, metrics=None, error=None):
    return {"workload": "w", "scheduling": "sync", "first_admission": first, "error": error, "leaked": [],
            "metrics": metrics or {"poisoned_loads": 0, "crashes": 0}}


def test_rows_agree_request_by_request_and_name_the_first_differences():
    preset = SimulatorRow({"poisoned_loads": 0, "crashes": 0, "lifecycle_violations": 0}, None,
                          {"a": [16, 0], "b": [0, 32], "c": [8, 8]})
    same = compare(release_row({"a": [16, 0], "b": [0, 32], "c": [8, 8]}), preset)
    assert (same["agreeing"], same["requests"], same["agree"]) == (3, 3, True)
    assert same["totals"]["release"] == same["totals"]["preset"] == {"gpu_hit_tokens": 24, "connector_hit_tokens": 40}
    # lifecycle_violations: the stock connector does not expose it (absent), which is no disagreement
    assert same["zero_metrics"]["lifecycle_violations"] == {"release": None, "preset": 0}

    # "c" admitted with fewer connector hits, "d" only in the release: two of four disagree
    differs = compare(release_row({"a": [16, 0], "b": [0, 32], "c": [8, 0], "d": [0, 0]}), preset)
    assert (differs["agreeing"], differs["requests"], differs["agree"]) == (2, 4, False)
    assert differs["first_differences"] == [{"request": "c", "release": [8, 0], "preset": [8, 8]},
                                           {"request": "d", "release": [0, 0], "preset": None}]
    assert differs["totals"]["release"] == {"gpu_hit_tokens": 24, "connector_hit_tokens": 32}

    # the same admissions, but the release crashed and the preset did not
    crashed = compare(release_row({"a": [16, 0], "b": [0, 32], "c": [8, 8]},
                                  {"poisoned_loads": 0, "crashes": 1}, {"message": "KeyError: 'r3'", "step": 40}),
                      preset)
    assert crashed["agreeing"] == 3 and not crashed["agree"]
    assert crashed["zero_metrics"]["crashes"] == {"release": 1, "preset": 0}

    # every request and total agrees, but a deterministic metric does not: named, and worth a second
    # pass; the connector's µs per step (a timing) and a metric only one side has are no difference
    metrics = {"poisoned_loads": 0, "crashes": 0, "offload_hit_rate": 0.305, "connector_us_per_step": 9.0,
               "steps": 166}
    hits = {"a": [16, 0], "b": [0, 32], "c": [8, 8]}
    rate_only = compare(release_row(hits, metrics),
                        SimulatorRow({**preset.metrics, "offload_hit_rate": 0.308, "connector_us_per_step": 2.0}, None,
                                     preset.first_admission))
    assert rate_only["agree"] and rate_only["differing_metrics"] == ["offload_hit_rate"]
    assert needs_second_pass(rate_only) and needs_second_pass(differs) and not needs_second_pass(same)
    # the second pass: the preset in the release's scheduler measured the same rate: "=" in the table
    rate_only["preset_in_release_scheduler"] = preset_inside(
        release_row(hits, metrics), {"metrics": {**metrics, "connector_us_per_step": 1.0}, "error": None,
                                     "first_admission": hits})
    # and one where its steps differ too
    differs["preset_in_release_scheduler"] = preset_inside(
        release_row({"a": [16, 0], "b": [0, 32], "c": [8, 0], "d": [0, 0]}, metrics),
        {"metrics": {**metrics, "steps": 170}, "error": None, "first_admission": hits})

    # docs/releases.md's table: "x (=)" where the release agrees with its preset, else "release / preset"
    lines = releases_markdown({"releases": [{"release": "0.26.0", "preset": "vllm-0.26",
                                             "rows": [differs, crashed, rate_only, same]}]}).splitlines()
    # rows recorded without steps: the step columns say so ("-")
    assert lines[2].startswith("| 0.26.0 | vllm-0.26 | w | sync | 2/4 · - · - | 24 (=) | 32 / 40 | 0 (=) | 0 (=) |")
    assert lines[3].startswith("| 0.26.0 | vllm-0.26 | w | sync | 3/3 · - · - | 24 (=) | 40 (=) | 0 (=) | 1 / 0 |")
    # the last column: the second pass (2 of 4 requests and the steps differ; never run; all equal; not needed)
    assert [line.rsplit("|", 2)[1].strip() for line in lines[2:]] == ["2/4 · - · -; steps differ", "not run",
                                                                     "= (all 3)", "-"]
    assert "| 0.305 / 0.308 |" in lines[4]
    # one table per workload size: the rows of the other workloads are left out
    other = releases_markdown({"releases": [{"release": "0.26.0", "preset": "vllm-0.26", "rows": [differs]}]},
                              ("multi-turn",))
    assert len(other.splitlines()) == 2


def test_the_same_hits_at_another_step_is_no_agreement():
    """Two engines can serve every request the same hits and still admit and finish them at other
    steps: the row counts each (hits · admitted at · finished at), and such a row disagrees."""
    hits = {"a": [16, 0], "b": [0, 32], "c": [8, 8]}
    preset = SimulatorRow({"poisoned_loads": 0, "crashes": 0}, None, hits,
                          {"a": [0, 9], "b": [3, 14], "c": [5, 20], "q": [None, 2]})
    on_time = compare({**release_row(hits), "steps": {"a": [0, 9], "b": [3, 14], "c": [5, 20], "q": [None, 2]}},
                      preset)
    assert on_time["agree"] and (on_time["admitted_agreeing"], on_time["finished_agreeing"]) == (3, 4)
    late = compare({**release_row(hits), "steps": {"a": [0, 9], "b": [4, 15], "c": [5, 21], "q": [None, 2]}}, preset)
    assert late["agreeing"] == 3 and not late["agree"] and needs_second_pass(late)
    assert (late["admitted_agreeing"], late["admitted_requests"]) == (2, 3)  # "q": aborted while queued
    assert (late["finished_agreeing"], late["finished_requests"]) == (2, 4)
    assert late["admitted_differences"] == [{"request": "b", "release": 4, "preset": 3}]
    [line] = releases_markdown({"releases": [{"release": "0.29.0", "preset": "vllm-0.29",
                                              "rows": [late]}]}).splitlines()[2:]
    assert line.startswith("| 0.29.0 | vllm-0.29 | w | sync | 3/3 · 2/3 · 2/4 | 24 (=) |")


def test_the_simulators_row_records_each_requests_steps():
    """The simulator's side of a row: every admitted request's first admission step, every
    request's finish step (an aborted one too), in the engine's step numbering."""
    from kvoffload.releases import simulator_row

    row = simulator_row("multi-turn-small", "async", None)
    assert set(row.first_admission) <= set(row.steps)
    assert all(row.steps[r][0] is not None for r in row.first_admission)
    assert all(admitted is None or admitted <= finished for admitted, finished in row.steps.values())
    assert max(finished for _, finished in row.steps.values()) < row.metrics["steps"]


def test_a_release_without_its_venv_is_one_line_naming_the_setup_command(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # no venv here nor in the checkout whose code runs (this checkout may hold 0.29.0's)
    monkeypatch.setattr(releases_cli, "CHECKOUT", tmp_path)
    code = main(["releases", "--release", "0.29.0", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "./scripts/setup-vllm 0.29.0" in err
    assert not (tmp_path / "r.json").exists()
    assert main(["releases", "--release", "0.24.0"]) == 2
    assert "no preset is mapped to it" in capsys.readouterr().err


def test_a_release_venv_runs_as_a_subprocess_and_its_rows_sit_beside_the_preset(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(releases_cli, "git_commit", lambda: "c0ffee-dirty")  # the commit this run measures at
    venv = tmp_path / venv_name("0.29.0") / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -c '{STAND_IN}' \"$@\"\n")
    os.chmod(venv / "python", 0o755)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "releases.json"
    earlier = {"release": "0.25.0", "preset": "vllm-0.25", "seconds": 7.0, "rows": []}
    # 0.29.0's earlier run measured both schedulings of the workload; this run measures sync only
    earlier_async = {"workload": "multi-turn-small", "scheduling": "async", "agree": True}
    earlier_sync = {"workload": "multi-turn-small", "scheduling": "sync", "agree": True}
    out.write_text(json.dumps({"schema": "kvoffload-bench/releases/v1", "releases": [
        earlier, {"release": "0.29.0", "preset": "vllm-0.29", "seconds": 1.0, "rows": [earlier_async, earlier_sync]}]}))
    code = main(["releases", "--release", "0.29.0", "--workload", "multi-turn-small", "--scheduling", "sync",
                 "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    table = json.loads(out.read_text())
    assert table["schema"] == "kvoffload-bench/releases/v1" and table["hash_seed"] == 0
    kept, entry = table["releases"]  # 0.25.0 kept from the earlier run, 0.29.0's sync row replaced
    assert kept == earlier
    assert (entry["release"], entry["preset"]) == ("0.29.0", "vllm-0.29")
    row, kept_row = entry["rows"]  # in the table's order: sync, then async
    assert kept_row == earlier_async and row["scheduling"] == "sync" and row != earlier_sync
    assert row["agreeing"] == row["requests"] - 1 and not row["agree"]
    # each row says which commit measured it; the earlier row has no commit, so the table claims none
    assert row["commit"] == "c0ffee-dirty" and "commit" not in kept_row
    assert table["provenance"] == {"commit": None, "commits": {"c0ffee-dirty": 1, "unknown": 1}}
    (difference,) = row["first_differences"]
    assert difference["release"][1] == difference["preset"][1] - 1
    assert row["totals"]["release"]["connector_hit_tokens"] == row["totals"]["preset"]["connector_hit_tokens"] - 1
    inside = row["preset_in_release_scheduler"]  # the second pass, for the disagreeing row only
    assert inside["agree"] and inside["agreeing"] == inside["requests"] == row["requests"]
    assert "the preset in vLLM 0.29.0's own scheduler" in stdout
    assert "vLLM 0.29.0 (stock connector) beside vllm-0.29" in stdout


def test_a_run_of_some_rows_replaces_those_rows_and_keeps_the_others():
    def row(workload, scheduling, tag):
        return {"workload": workload, "scheduling": scheduling, "tag": tag}

    earlier = [{"release": "0.25.0", "preset": "vllm-0.25", "seconds": 100.0,
                "rows": [row("multi-turn-small", "sync", "old"), row("multi-turn", "sync", "old")]},
               {"release": "0.30.0", "preset": "vllm-0.29", "seconds": 50.0,  # measured under another preset
                "rows": [row("multi-turn", "async", "old")]},
               {"release": "0.31.0", "preset": "reference", "seconds": 9.0, "rows": [row("multi-turn", "sync", "old")]}]
    measured = [{"release": "0.30.0", "preset": "vllm-0.30", "seconds": 20.0, "rows": [row("multi-turn", "sync", "new")]},
                {"release": "0.25.0", "preset": "vllm-0.25", "seconds": 30.0,
                 "rows": [row("multi-turn", "sync", "new"), row("shared-prefix-small", "async", "new")]}]
    table = releases_cli._merged(earlier, measured)
    assert [entry["release"] for entry in table] == ["0.25.0", "0.30.0", "0.31.0"]
    first, second, untouched = table
    # 0.25.0: the small row kept, the full sync row replaced; rows in workload order; both runs' time
    assert [(r["workload"], r["tag"]) for r in first["rows"]] == [
        ("shared-prefix-small", "new"), ("multi-turn-small", "old"), ("multi-turn", "new")]
    assert first["seconds"] == 130.0
    # 0.30.0: the earlier rows came from another preset, so none of them stays
    assert second["rows"] == [row("multi-turn", "sync", "new")] and second["seconds"] == 20.0
    assert untouched == earlier[2]


def test_the_table_names_one_commit_only_when_every_row_has_it():
    def entry(release, *commits):
        return {"release": release, "rows": [{"workload": "w", "scheduling": "sync", "commit": c} for c in commits]}

    assert releases_cli.provenance([entry("0.25.0", "abc"), entry("0.29.0", "abc", "abc")]) == {
        "commit": "abc", "commits": {"abc": 3}}
    # two runs, one release each, at different commits (one of them with uncommitted changes)
    assert releases_cli.provenance([entry("0.25.0", "abc"), entry("0.29.0", "def-dirty", "def-dirty")]) == {
        "commit": None, "commits": {"abc": 1, "def-dirty": 2}}
    assert releases_cli.provenance([entry("0.25.0", None)]) == {"commit": None, "commits": {"unknown": 1}}


def test_runs_of_two_releases_merge_one_at_a_time(tmp_path):
    """Two ``kvoffload releases --release X`` at once merge into one table: the second waits for
    the first's read-merge-write, so neither replaces the table with the other's rows missing."""
    import threading

    entered = threading.Event()

    def second():
        with locked_folder(tmp_path / "table"):
            entered.set()

    with locked_folder(tmp_path / "table"):
        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.3)  # held by the first run
    assert entered.wait(5)
    thread.join()


class Clock:
    """``time`` for the command: each reading 10.5 s after the one before."""

    def __init__(self):
        self.readings = []

    def perf_counter(self) -> float:
        self.readings.append(1000.0 + 10.5 * len(self.readings))
        return self.readings[-1]


def test_the_run_reports_its_time_and_the_table_the_sum_of_its_entries_to_a_tenth(capsys, tmp_path, monkeypatch):
    """The closing line gives the run's wall time (its first clock reading to its last); the
    table's ``seconds`` is the sum of its entries', to a tenth, an earlier entry measured to the
    hundredth (a table from another tool) included."""
    row = {"release": "0.29.0", "workload": "multi-turn-small", "scheduling": "sync", "metrics": {"crashes": 0},
           "error": None, "leaked": [], "stuck": [], "first_admission": {"r0": [0, 16]}}
    stand_in_venv(tmp_path, f"print({json.dumps(json.dumps(row))})\n")
    clock = Clock()
    monkeypatch.setattr(releases_cli, "time", clock)
    monkeypatch.setattr(releases_cli, "CHECKOUT", tmp_path)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "t.json"
    out.write_text(json.dumps({"schema": "kvoffload-bench/releases/v1", "releases": [
        {"release": "0.25.0", "preset": "vllm-0.25", "seconds": 2.23, "rows": []}]}))
    assert main(["releases", "--release", "0.29.0", "--workload", "multi-turn-small", "--scheduling", "sync",
                 "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"1 releases x 1 replays in {clock.readings[-1] - clock.readings[0]:.0f} s;" in stdout
    table = json.loads(out.read_text())
    measured = table["releases"][1]["seconds"]
    assert measured > 0 and table["seconds"] == round(2.23 + measured, 1)


def test_a_release_that_dies_is_named_with_the_last_line_it_printed(capsys, tmp_path, monkeypatch):
    """What a dying process prints last is why it died (a traceback's last line); the jobs it was
    given are the small workloads in both schedulings unless --full asks for the others too."""
    stand_in_venv(tmp_path, "import sys\nprint('loading vLLM', file=sys.stderr)\n"
                           "print('jobs:', *sys.argv[3:], file=sys.stderr)\nsys.exit(3)\n")
    monkeypatch.setattr(releases_cli, "CHECKOUT", tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["releases", "--release", "0.29.0", "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    jobs = " ".join(f"{w}:{s}" for w in releases_cli.SMALL_WORKLOADS for s in releases_cli.SCHEDULINGS)
    assert err.startswith("kvoffload: error: vLLM 0.29.0: ") and err.count("\n") == 1, err
    assert err.endswith(f"{venv_name('0.29.0')}/bin/python exited 3: jobs: {jobs}\n"), err
    assert not (tmp_path / "t.json").exists()


def test_a_table_nested_past_the_parsers_depth_is_refused_with_its_reason_cut_short(capsys, tmp_path):
    """The parser's own reason (a RecursionError's, longer than 80 characters), cut to 80: the line
    stays short, the table is not replaced."""
    out = tmp_path / "t.json"
    text = '{"schema": "kvoffload-bench/releases/v1", "releases": ' + "[" * 100_000
    out.write_text(text)
    try:
        json.loads(text)
    except RecursionError as error:
        reason = str(error)
    assert len(reason) > 80
    assert main(["releases", "--release", "0.29.0", "--workload", "multi-turn-small", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"kvoffload: error: --out {out}: not a release table (not JSON: {reason[:80]})\n"
    assert out.read_text() == text
