"""kvoffload compare A B: each metric's change judged by the glossary's direction, in four formats,
and a non-zero exit on a worse deterministic metric when asked (--fail-on-worse)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.metrics import judge
from kvoffload.results import SCHEMA


def write_result(path: Path, label: str, **metrics) -> Path:
    path.write_text(json.dumps({"schema": SCHEMA, "workload": {"name": "w"}, "connector": {"label": label},
                                "config": {}, "metrics": metrics, "provenance": {"commit": "abc"}, "error": None}))
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
