"""A few fuzzed definitions that pass validation run for real, each in its own process: an exit
code, not a signal; a result file that records the crash on exit 1; within the time bound. And a
parallel sweep ended by Ctrl-C or kill -9 at a drawn moment (issue 22).

Slower than the in-process tests (a process imports torch), so only a handful of examples; the
definitions that fail validation are the in-process tests' business (``assume`` skips them)."""

from __future__ import annotations

import json
import subprocess
import sys

from fuzz_inputs import INPUTS, definition, fuzz_settings, mooncake_trace, toml_text
from hypothesis import assume, given
from hypothesis import strategies as st

from kvoffload.workloads import WorkloadError, load_workload

SECONDS = 120  # one fuzzed workload's replay: tiny, but a loaded machine is slow to start torch


@fuzz_settings(2)
@given(fuzzed=definition(), trace=mooncake_trace())
def test_fuzzed_definitions_run_in_a_process(fuzzed, trace, tmp_path_factory):
    INPUTS["definitions run in a process"] += 1
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


def _sweep_stories():
    """tests/sweep/test_sweep_processes.py, the owner of the helpers that start a sweep and find
    its workers (loaded by path: test folders are not packages)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "sweep" / "test_sweep_processes.py"
    spec = importlib.util.spec_from_file_location("sweep_process_stories", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@fuzz_settings(2, seconds=300)  # a sweep's workers import torch before the signal comes
@given(moment=st.floats(0.0, 6.0), ctrl_c=st.booleans())
def test_a_parallel_sweep_ended_at_any_moment_leaves_no_worker_and_no_partial_file(moment, ctrl_c,
                                                                                    tmp_path_factory):
    """Ctrl-C (the whole process group) or kill -9 (the sweep alone), ``moment`` seconds after
    both workers exist: from still importing to deep in their cells (issue 22)."""
    import os
    import signal

    INPUTS["sweep signals"] += 1
    stories = _sweep_stories()
    folder = tmp_path_factory.mktemp("signal")
    sweep, workers = stories.start_sweep(folder, moment)
    try:
        if ctrl_c:
            os.killpg(sweep.pid, signal.SIGINT)
        else:
            sweep.kill()
        sweep.wait(timeout=60)
        left = stories.wait_gone(workers)
    finally:
        for pid in workers:
            if stories.alive(pid):
                os.kill(pid, signal.SIGKILL)
        _, err = sweep.communicate(timeout=60)
    assert left == []
    if ctrl_c:
        assert sweep.returncode == 130 and err == "kvoffload: interrupted\n"
    written = list((folder / "out").iterdir()) if (folder / "out").exists() else []
    assert not [path for path in written if path.name.endswith(".tmp")]
