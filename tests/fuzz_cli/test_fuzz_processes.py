"""A few fuzzed definitions that pass validation run for real, each in its own process: an exit
code, not a signal; a result file that records the crash on exit 1; within the time bound.

Slower than the in-process tests (a process imports torch), so only a handful of examples; the
definitions that fail validation are the in-process tests' business (``assume`` skips them)."""

from __future__ import annotations

import json
import subprocess
import sys

from fuzz_inputs import definition, fuzz_settings, mooncake_trace, toml_text
from hypothesis import assume, given

from kvoffload.workloads import WorkloadError, load_workload

SECONDS = 120  # one fuzzed workload's replay: tiny, but a loaded machine is slow to start torch


@fuzz_settings(2)
@given(fuzzed=definition(), trace=mooncake_trace())
def test_fuzzed_definitions_run_in_a_process(fuzzed, trace, tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    (folder / "trace.jsonl").write_text(trace)
    (folder / "chat.json").write_text('[{"conversations": [{"from": "human", "value": "hi"}, '
                                      '{"from": "gpt", "value": "hello there"}]}]')
    (folder / "w.toml").write_text(toml_text(fuzzed))
    try:
        load_workload(str(folder / "w.toml"))
    except WorkloadError:
        assume(False)
    done = subprocess.run([sys.executable, "-m", "kvoffload.cli", "run", "--quiet", "--workload", "w.toml",
                           "--out", "r.json"], cwd=folder, capture_output=True, text=True, timeout=SECONDS)
    assert done.returncode in (0, 1, 2), done.stderr  # negative: killed by a signal
    assert "Traceback" not in done.stderr
    if done.returncode == 2:
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("kvoffload: error: ")
        assert not (folder / "r.json").exists()
    else:
        result = json.loads((folder / "r.json").read_text())
        assert (result["error"] is not None) == (done.returncode == 1)
