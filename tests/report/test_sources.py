"""What the report refuses to put on one axis: runs of one workload from two commits."""

from __future__ import annotations

import json
from pathlib import Path

from kvoffload.cli import main
from kvoffload.results import SCHEMA


def write_run(path: Path, workload: str, label: str, commit: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schema": SCHEMA, "workload": {"name": workload}, "connector": {"label": label, "preset": None},
        "config": {"cpu_chunks": 64, "engine": "simulator"},
        "metrics": {"last_block_hit_rate": 1.0, "poisoned_loads": 0, "lifecycle_violations": 0,
                    "offload_hit_rate": 0.5},
        "provenance": {"commit": commit}, "error": None}))


def test_runs_of_one_workload_from_two_commits_are_refused_before_any_figure(tmp_path, capsys):
    """A bench at commit abc, then an ad-hoc run after an edit (abc-dirty) in the same folder."""
    source, out = tmp_path / "runs", tmp_path / "charts"
    write_run(source / "bench-w-reference.json", "w", "reference", "abc")
    write_run(source / "w-reference-no-fix.json", "w", "reference -fix", "abc-dirty")
    assert main(["report", "--from", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "from different commits" in err[0]
    assert "bench-w-reference.json (commit abc)" in err[0] and "(commit abc-dirty)" in err[0]
    assert not out.exists()


def test_one_commit_per_workload_is_drawn(tmp_path, capsys):
    """Two workloads of two commits never share a chart: both are drawn, each footer says its commit."""
    source, out = tmp_path / "runs", tmp_path / "charts"
    write_run(source / "a-reference.json", "a", "reference", "abc")
    write_run(source / "a-vllm-0.25.json", "a", "vllm-0.25", "abc")
    write_run(source / "b-reference.json", "b", "reference", "def")
    assert main(["report", "--from", str(source), "--out", str(out)]) == 0
    assert (out / "index.html").is_file()


def test_a_report_with_nothing_run_yet_says_where_results_are(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvoffload: error: out: no such directory") and "--from results" in err
    assert list(tmp_path.iterdir()) == []
