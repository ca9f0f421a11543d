"""What the report refuses to put on one axis: runs of one workload from two commits, two
engines or two configurations (only the connector and cpu_chunks may differ)."""

from __future__ import annotations

import json
from pathlib import Path

from kvoffload.cli import main
from kvoffload.results import SCHEMA


def write_run(path: Path, workload: str, label: str, commit: str | None, **config) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schema": SCHEMA, "workload": {"name": workload}, "connector": {"label": label, "preset": None},
        "config": {"cpu_chunks": 64, "gpu_blocks": 64, "engine": "simulator", "connector": "reference", **config},
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


def refusal(tmp_path, capsys) -> str:
    source, out = tmp_path / "runs", tmp_path / "charts"
    assert main(["report", "--from", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not out.exists()
    return err[0]


def test_runs_of_one_workload_on_two_engines_are_refused(tmp_path, capsys):
    """kvoffload bench on the simulator, then the same workload on vLLM's scheduler, in one folder."""
    write_run(tmp_path / "runs" / "bench-w-reference.json", "w", "reference", "abc")
    write_run(tmp_path / "runs" / "w-stock.json", "w", "stock", "abc", engine="vllm-scheduler", connector="stock")
    err = refusal(tmp_path, capsys)
    assert "on different engines" in err and "(engine simulator)" in err and "(engine vllm-scheduler)" in err
    assert "bench-w-reference.json" in err and "w-stock.json" in err


def test_runs_of_one_workload_with_a_set_override_are_refused(tmp_path, capsys):
    """kvoffload run --set gpu_blocks=40 beside the bench's runs: two setups, not two connectors."""
    write_run(tmp_path / "runs" / "bench-w-reference.json", "w", "reference", "abc")
    write_run(tmp_path / "runs" / "bench-w-vllm-0.25.json", "w", "vllm-0.25", "abc")
    write_run(tmp_path / "runs" / "w-small-gpu.json", "w", "reference", "abc", gpu_blocks=40)
    err = refusal(tmp_path, capsys)
    assert "with different configurations (gpu_blocks 64 vs 40)" in err and "w-small-gpu.json" in err


def test_a_key_only_one_run_has_is_a_different_configuration(tmp_path, capsys):
    write_run(tmp_path / "runs" / "a.json", "w", "reference", "abc")
    write_run(tmp_path / "runs" / "b.json", "w", "vllm-0.25", "abc", model="tiny-llama")
    assert "(model (absent) vs \"tiny-llama\")" in refusal(tmp_path, capsys)


def test_connectors_and_cpu_tier_sizes_share_a_chart(tmp_path, capsys):
    """What the charts compare may differ: the connector (label and config.connector) and cpu_chunks
    (the capacity chart's axis); the other workload may be on another engine, it has its own charts."""
    source, out = tmp_path / "runs", tmp_path / "charts"
    for chunks in (16, 64):
        write_run(source / f"w-reference-{chunks}.json", "w", "reference", "abc", cpu_chunks=chunks)
    write_run(source / "w-vllm-0.25.json", "w", "vllm-0.25", "abc")
    write_run(source / "v-reference.json", "v", "reference", "abc", engine="vllm-scheduler")
    write_run(source / "v-stock.json", "v", "stock", "abc", engine="vllm-scheduler", connector="stock")
    assert main(["report", "--from", str(source), "--out", str(out)]) == 0
    assert (out / "index.html").is_file()
