"""The command line as a user meets it: a good run, and bad input that fails cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.cli import main
from kvoffload.metrics import MEASURED_METRICS

REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_prints_the_table_and_writes_the_result(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, stdout, _ = run_cli(capsys, "run", "--workload", "multi-turn-small", "--quiet", "--out", str(out))
    assert code == 0
    assert "last_block_hit_rate" in stdout and "poisoned_loads" in stdout
    result = json.loads(out.read_text())
    assert set(result) == {"schema", "workload", "connector", "config", "metrics", "provenance", "error",
                           "diagnostics", "distributions"}
    assert result["connector"]["label"] == "reference" and result["connector"]["disabled"] == []
    assert result["metrics"]["poisoned_loads"] == 0 and result["error"] is None
    assert result["provenance"]["seed"] == result["config"]["seed"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_same_command_gives_the_same_metrics(capsys, tmp_path):
    measured = MEASURED_METRICS
    metrics = []
    for name in ("a.json", "b.json"):
        assert run_cli(capsys, "run", "--workload", "spec-decode-small", "--quiet", "--out", str(tmp_path / name))[0] == 0
        values = json.loads((tmp_path / name).read_text())["metrics"]
        metrics.append({k: v for k, v in values.items() if k not in measured})
    assert metrics[0] == metrics[1]


def test_a_crashing_connector_exits_1_and_records_the_error(capsys, tmp_path):
    """vLLM 0.26 died on a queued abort (#49118): abort every other request before it is scheduled."""
    definition = tmp_path / "aborting.toml"
    bundled = (REPO / "workloads" / "multi-turn-small.toml").read_text().split("[aborts]")[0]
    definition.write_text(bundled + "[aborts]\nshare = 0.5\nafter_steps = 0\n")
    out = tmp_path / "crash.json"
    code, _, err = run_cli(capsys, "run", "--workload", str(definition), "--preset", "vllm-0.26", "--quiet",
                           "--out", str(out))
    assert code == 1
    result = json.loads(out.read_text())
    assert "len(offload_keys) == len(block_ids)" in result["error"]["message"]
    assert result["metrics"]["crashes"] == 1
    assert "run failed at step" in err


def test_disable_fix_and_set_reach_the_run(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, _, _ = run_cli(capsys, "run", "--workload", "spec-decode-small", "--disable-fix", "final_token_watermark",
                         "--set", "cpu_chunks=512", "--quiet", "--out", str(out))
    result = json.loads(out.read_text())
    assert code == 0
    assert result["connector"]["disabled"] == ["final_token_watermark"]
    assert result["config"]["cpu_chunks"] == 512
    assert result["metrics"]["poisoned_loads"] > 0


def test_trace_export_is_a_chrome_trace_of_the_jobs(capsys, tmp_path):
    out, trace = tmp_path / "r.json", tmp_path / "trace.json"
    code, _, _ = run_cli(capsys, "run", "--workload", "multi-turn-small", "--quiet", "--out", str(out),
                         "--trace", str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    assert code == 0 and events
    assert {event["name"].split()[0] for event in events} == {"store", "load"}
    steps = json.loads(out.read_text())["metrics"]["steps"]
    assert all(0 <= event["ts"] < steps and event["tid"] for event in events)


def test_compare_shows_differences(capsys, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    run_cli(capsys, "run", "--workload", "spec-decode-small", "--quiet", "--out", str(a))
    run_cli(capsys, "run", "--workload", "spec-decode-small", "--preset", "vllm-0.29", "--quiet", "--out", str(b))
    code, stdout, _ = run_cli(capsys, "compare", str(a), str(b))
    assert code == 0
    (poison_line,) = [line for line in stdout.splitlines() if line.startswith("poisoned_loads")]
    assert poison_line.split()[1] == "0" and poison_line.split()[3].startswith("+")


def test_fixes_and_workloads_listings(capsys):
    code, stdout, _ = run_cli(capsys, "fixes")
    assert code == 0 and "final_token_watermark" in stdout and "#54288" in stdout and "vllm-0.29" in stdout
    # every release rule of a preset, as docs/fixes.md's preset table has it
    (old_release,) = [line for line in stdout.splitlines() if line.strip().startswith("vllm-0.25 ")]
    assert "Mamba states stored from: block-table" in old_release and "store cursor: may move back" in old_release
    assert "window blocks a load may need: the window's;" in old_release
    assert old_release.endswith("drafter groups, none flagged: every group")
    code, stdout, _ = run_cli(capsys, "workloads")
    assert code == 0 and "multi-turn-small" in stdout and "spec-decode" in stdout
    code, stdout, _ = run_cli(capsys, "workloads", "show", "multi-turn-small")
    assert code == 0 and "reus" in stdout.lower()


BAD_INPUT = [
    (["run", "--workload", "no-such-workload"], "no-such-workload: unknown workload"),
    (["run", "--workload", "multi-turn-small", "--disable-fix", "bogus"], "unknown fix 'bogus'"),
    (["run", "--workload", "multi-turn-small", "--preset", "vllm-0.99"], "unknown preset 'vllm-0.99'"),
    (["run", "--workload", "multi-turn-small", "--set", "colour=blue"], "unknown setting 'colour'"),
    (["run", "--workload", "multi-turn-small", "--set", "gpu_blocks=many"], "gpu_blocks expects an integer"),
    (["run", "--workload", "multi-turn-small", "--set", "gpu_blocks=1"], "gpu_blocks must be at least 2"),
    (["run", "--workload", "multi-turn-small", "--set", "gpu_blocks"], "--set expects KEY=VALUE"),
    (["run", "--workload", "multi-turn-small", "--scheduling", "eager"], "invalid choice: 'eager'"),
    (["run", "--workload", "multi-turn-small", "--out", "{tmp}/broken.toml/r.json"], "broken.toml is not a directory"),
    (["run", "--workload", "multi-turn-small", "--out", "{tmp}"], "is a directory"),
    (["run", "--workload", "{tmp}/broken.toml"], "line 2, column"),
    (["run", "--workload", "{tmp}/unknown-key.toml"], "generator.colour"),
    (["run", "--workload", "mooncake:{tmp}/none.jsonl"], "none.jsonl"),
    (["run", "--workload", "mooncake:{tmp}/trace.jsonl"], "line 2"),
    (["compare", "{tmp}/broken.toml", "{tmp}/broken.toml"], "not JSON"),
    (["workloads", "show"], "needs a NAME or PATH"),
    (["launch"], "invalid choice: 'launch'"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUT, ids=[" ".join(a)[:60] for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_no_result(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)  # a default result path would land here
    (tmp_path / "broken.toml").write_text('name = "x"\ndescription = \n')
    bundled = (REPO / "workloads" / "shared-prefix-small.toml").read_text()
    (tmp_path / "unknown-key.toml").write_text(bundled.replace("[generator]\n", "[generator]\ncolour = 1\n"))
    (tmp_path / "trace.jsonl").write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n{"timestamp": 5, "inp\n')
    before = set(tmp_path.rglob("*"))
    code, _, err = run_cli(capsys, *[part.replace("{tmp}", str(tmp_path)) for part in argv])
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("kvoffload: error: ") and message in err
    assert "Traceback" not in err
    assert set(tmp_path.rglob("*")) == before  # nothing half-written


def test_console_script_fails_cleanly_in_a_fresh_process(tmp_path):
    script = Path(sys.executable).parent / "kvoffload"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kvoffload.cli"]
    done = subprocess.run(command + ["run", "--workload", "nope"], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvoffload: error: nope: unknown workload (expected")
    assert "multi-turn" in lines[0] and done.stdout == ""


def test_metrics_do_not_depend_on_the_process_hash_seed(tmp_path):
    """Strings and bytes hash differently in every process: no decision may iterate over them."""
    script = Path(sys.executable).parent / "kvoffload"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kvoffload.cli"]
    measured = MEASURED_METRICS
    metrics = []
    for seed in ("1", "2"):
        out = tmp_path / f"seed{seed}.json"
        done = subprocess.run(command + ["run", "--workload", "multi-turn-small", "--preset", "vllm-0.25", "--quiet",
                                         "--out", str(out)], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300)
        assert done.returncode == 0, done.stderr
        values = json.loads(out.read_text())["metrics"]
        metrics.append({k: v for k, v in values.items() if k not in measured})
    assert metrics[0] == metrics[1]


def test_bench_small_keeps_its_own_summary(capsys, tmp_path, monkeypatch):
    """A smoke run must not replace the committed full-size summary. The replays are stubbed with
    one real outcome (the table and the files are what is under test, not the engine)."""
    import kvoffload.cli.bench
    from kvoffload.runner import ConnectorChoice, replay_workload
    from kvoffload.workloads import load_workload

    outcome = replay_workload(load_workload("multi-turn-small"), ConnectorChoice.build())
    monkeypatch.setattr(kvoffload.cli.bench, "replay", lambda *args, **kwargs: outcome)
    (tmp_path / "bench-summary.json").write_text('{"full": true}')
    code, stdout, _ = run_cli(capsys, "bench", "--small", "--quiet", "--out-dir", str(tmp_path))
    assert code == 0 and "bench-summary-small.json" in stdout
    assert json.loads((tmp_path / "bench-summary.json").read_text()) == {"full": True}
    summary = json.loads((tmp_path / "bench-summary-small.json").read_text())
    assert len(summary["rows"]) == len(list(tmp_path.glob("bench-*-small-*.json")))


def test_the_oracle_line_counts_the_requests_it_could_not_compare_and_only_those():
    """Under a real-model run's table: the oracle's verdict, with how many requests had no
    offload-off twin to compare with (said only when some had none) and the first mismatch."""
    from kvoffload.cli.run import oracle_line
    from kvoffload.vllm.outputs import RequestOutcome, compare_outputs

    baseline = {r: RequestOutcome(r, (1, 2, 3), [7, 8], [-0.5, -0.25]) for r in ("a", "b")}
    run = {"a": RequestOutcome("a", (1, 2, 3), [7, 8], [-0.5, -0.25]),
           "b": RequestOutcome("b", (1, 2, 3), [7, 9], [-0.5, -0.25]),
           "c": RequestOutcome("c", (1, 2, 3), [7, 8], [-0.5, -0.25])}  # absent from the offload-off run
    every = compare_outputs(run, baseline, tokens_per_chunk=16, tolerance=1e-3).as_dict()
    head, mismatch = oracle_line(every).split("\n")
    assert head.startswith("output oracle: 1 of 2 requests identical") and head.endswith("; 1 not compared")
    assert mismatch == "first mismatch: request b: output position 1 (sequence position 4) has token 9 instead of 8; " \
                       "no chunk loaded for it"
    del run["c"]
    line = oracle_line(compare_outputs(run, baseline, tokens_per_chunk=16, tolerance=1e-3).as_dict())
    assert "not compared" not in line and line.split("\n")[0] == head.removesuffix("; 1 not compared")
