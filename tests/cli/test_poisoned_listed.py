"""A run that served poisoned KV says which loads, not only how many: the result file lists the
first ones as request, step, chunk and bad slots with their count, ``run`` prints the same under
its table, and ``--strict`` turns any zero-metric above 0 into exit 1. The bug is real and
planted: spec-decode-small with the ``final_token_watermark`` fix off loads rejected drafts
(docs/fixes.md)."""

from __future__ import annotations

import json

from kvoffload.cli import main
from kvoffload.engine.record import POISONED_LISTED

PLANTED = ("run", "--workload", "spec-decode-small", "--disable-fix", "final_token_watermark", "--quiet")


def run(capsys, tmp_path, *extra):
    out = tmp_path / "r.json"
    code = main([*PLANTED, "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, json.loads(out.read_text()), captured.out, captured.err


def test_the_result_lists_the_first_poisoned_loads_and_their_count(capsys, tmp_path):
    code, result, stdout, _ = run(capsys, tmp_path)
    count = result["metrics"]["poisoned_loads"]
    listed = result["poisoned_loads"]
    assert code == 0 and count > POISONED_LISTED  # without --strict, poisoned KV is a figure, not a failure
    assert listed["count"] == count and len(listed["first"]) == POISONED_LISTED
    assert all({"req_id", "step", "chunk", "bad_slots"} <= set(p) and p["bad_slots"] > 0 for p in listed["first"])
    steps = [p["step"] for p in listed["first"]]
    assert steps == sorted(steps)  # the first ones, in the order the run met them

    # run prints the same loads under its table, and how many more there were
    lines = stdout.splitlines()
    head = lines.index(f"poisoned loads: {count} (request, step, chunk, bad slots)")
    first = listed["first"][0]
    assert lines[head + 1].strip().startswith(f"{first['req_id']} step {first['step']} chunk {first['chunk']}: ")
    assert lines[head + 1 + POISONED_LISTED].strip() == f"... and {count - POISONED_LISTED} more"


def test_strict_makes_poisoned_loads_a_failed_run(capsys, tmp_path):
    code, result, _, err = run(capsys, tmp_path, "--strict")
    assert code == 1
    assert f"--strict: poisoned_loads={result['metrics']['poisoned_loads']}" in err


def test_strict_passes_a_clean_run(capsys, tmp_path):
    out = tmp_path / "r.json"
    assert main(["run", "--workload", "spec-decode-small", "--quiet", "--strict", "--out", str(out)]) == 0
    assert "poisoned loads" not in capsys.readouterr().out
