"""kvoffload compare A B: each metric's change judged by the glossary's direction, in four formats,
and a non-zero exit on a worse deterministic metric when asked (--fail-on-worse)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.metrics import judge
from kvoffload.results import SCHEMA


def write_result(path: Path, label: str, *, workload: dict | None = None, config: dict | None = None,
                 commit: str = "abc", **metrics) -> Path:
    path.write_text(json.dumps({"schema": SCHEMA, "workload": workload or {"name": "w"}, "connector": {"label": label},
                                "config": config or {}, "metrics": metrics, "provenance": {"commit": commit},
                                "error": None}))
    return path


@pytest.mark.parametrize("name, before, after, verdict", [
    ("last_block_hit_rate", 0.9, 0.8, "worse"),  # higher is better
    ("last_block_hit_rate", 0.8, 0.9, "better"),
    ("store_visible_delay_steps_p99", 4, 5, "worse"),  # lower is better
    ("poisoned_loads", 0, 3, "worse"),  # zero: any count is a bug
    ("poisoned_loads", 5, 2, "better"),  # closer to zero
    ("steps", 100, 90, "info"),  # no direction
    ("tokens_per_s_modeled", 500.0, 500.0 * (1 + 1e-12), "same"),  # float noise
    ("gpu_hit_rate", None, 0.5, "info"),  # a value that appeared: nothing to judge
    ("gpu_hit_rate", 0.5, None, "info"),  # ... or disappeared
    ("no_such_metric", 1, 2, "info"),
])
def test_a_verdict_reads_the_glossarys_direction(name, before, after, verdict):
    assert judge(name, before, after) == verdict


@pytest.fixture
def pair(tmp_path):
    """B is A with a poisoned load, a lower hit rate, more steps and a faster connector."""
    a = write_result(tmp_path / "a.json", "reference", poisoned_loads=0, last_block_hit_rate=1.0, steps=100,
                     connector_us_per_step=50.0, preemptions=2)
    b = write_result(tmp_path / "b.json", "reference -fix", poisoned_loads=2, last_block_hit_rate=0.75, steps=120,
                     connector_us_per_step=80.0)
    return a, b


def test_text_labels_each_change_and_fails_on_worse_only_when_asked(pair, capsys):
    a, b = pair
    assert main(["compare", str(a), str(b)]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["poisoned_loads"][1:] == ["0", "2", "+2", "worse", "deterministic"]
    assert lines["last_block_hit_rate"][-2:] == ["worse", "deterministic"]
    assert lines["steps"][-2:] == ["info", "deterministic"]
    assert lines["connector_us_per_step"][-2:] == ["worse", "measured"]
    assert lines["preemptions"][1:] == ["2", "-", "-", "info", "deterministic"]  # only A has it
    assert main(["compare", "--fail-on-worse", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "deterministic worse: last_block_hit_rate, poisoned_loads" in out
    assert main(["compare", "--fail-on-worse", str(b), str(a)]) == 0  # the other way round all is better


def test_a_measured_metric_alone_does_not_fail(tmp_path, capsys):
    """Wall-clock numbers move between any two runs: judged, shown, never a failure."""
    a = write_result(tmp_path / "a.json", "x", steps=10, connector_us_per_step=50.0)
    b = write_result(tmp_path / "b.json", "x", steps=10, connector_us_per_step=500.0)
    assert main(["compare", "--fail-on-worse", str(a), str(b)]) == 0


def test_json_csv_and_markdown_carry_the_same_rows(pair, capsys):
    a, b = pair
    assert main(["compare", "--format", "json", str(a), str(b)]) == 0
    document = json.loads(capsys.readouterr().out)
    rows = {row["metric"]: row for row in document["rows"]}
    assert rows["poisoned_loads"] == {"metric": "poisoned_loads", "a": 0, "b": 2, "change": 2, "verdict": "worse",
                                      "kind": "deterministic"}
    assert document["worse"] == ["last_block_hit_rate", "poisoned_loads"]
    assert document["a"]["connector"] == "reference" and document["b"]["file"] == str(b)

    assert main(["compare", "--format", "csv", str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "metric,a,b,change,verdict,kind"
    assert "poisoned_loads,0,2,2,worse,deterministic" in lines
    assert not [line for line in lines if line.startswith("gpu_hit_rate,")]  # in neither file: no row
    assert len(lines) == 1 + len(document["rows"])

    assert main(["compare", "--format", "markdown", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| poisoned_loads | 0 | 2 | +2 | worse | deterministic |" in out


SPEC = {"name": "spec-decode-small", "source": "spec-decode-small", "seed": 3, "requests": 32}
SIMULATOR = {"cpu_chunks": 1024, "scheduling": "sync", "engine": "simulator", "connector": "reference"}


def refusal(capsys, a: Path, b: Path) -> str:
    assert main(["compare", str(a), str(b)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    return captured.err.strip()


def test_two_workloads_are_refused_naming_both(tmp_path, capsys):
    """spec-decode-small against multi-turn-small: every "worse" would be the other workload's."""
    a = write_result(tmp_path / "a.json", "reference", workload=SPEC, config=SIMULATOR, poisoned_loads=0)
    b = write_result(tmp_path / "b.json", "reference", config=SIMULATOR, poisoned_loads=3,
                     workload={**SPEC, "name": "multi-turn-small", "source": "multi-turn-small"})
    assert refusal(capsys, a, b) == (f"kvoffload: error: compare: {a} (workload spec-decode-small) and {b} (workload "
                                     f"multi-turn-small) replay different workloads; a verdict needs two runs of one "
                                     f"workload")
    # the same name with another seed is another workload too
    c = write_result(tmp_path / "c.json", "reference", workload={**SPEC, "seed": 4}, config=SIMULATOR)
    assert "different versions of workload spec-decode-small (seed 3 vs 4)" in refusal(capsys, a, c)


def test_two_engine_configurations_are_refused_naming_what_differs(tmp_path, capsys):
    a = write_result(tmp_path / "a.json", "reference", workload=SPEC, config=SIMULATOR, offload_hit_rate=0.5)
    b = write_result(tmp_path / "b.json", "reference", workload=SPEC, config={**SIMULATOR, "cpu_chunks": 2048},
                     offload_hit_rate=0.6)
    assert (f"compare: {a} and {b} ran spec-decode-small on different engine configurations (cpu_chunks 1024 vs "
            f"2048); a verdict needs one configuration") in refusal(capsys, a, b)
    c = write_result(tmp_path / "c.json", "vllm-stock", workload=SPEC, offload_hit_rate=0.5,
                     config={**SIMULATOR, "engine": "vllm-scheduler", "connector": "stock", "scheduling": "async"})
    assert ('(engine "simulator" vs "vllm-scheduler", scheduling "sync" vs "async")'
            in refusal(capsys, a, c))


def test_another_connector_fix_flag_or_commit_is_what_compare_is_for(tmp_path, capsys):
    a = write_result(tmp_path / "a.json", "reference", workload=SPEC, config=SIMULATOR, poisoned_loads=0)
    no_fix = write_result(tmp_path / "b.json", "reference -final_token_watermark", workload=SPEC, config=SIMULATOR,
                          poisoned_loads=19, commit="def-dirty")
    stock = write_result(tmp_path / "c.json", "vllm-stock", workload=SPEC, config={**SIMULATOR, "connector": "stock"},
                         poisoned_loads=0)
    assert main(["compare", str(a), str(no_fix)]) == 0
    assert "poisoned_loads" in capsys.readouterr().out
    assert main(["compare", str(a), str(stock)]) == 0
