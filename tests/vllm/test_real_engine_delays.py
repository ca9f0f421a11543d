"""Store submission delays measured on vLLM's real engine (``--engine vllm``), the run's drain,
and its pinned hash seed, on the two requests of ``real_engine_delays.py`` (delays worked out
there by hand). Two engine starts of a few seconds each, in subprocesses; KVOFFLOAD_SKIP_REAL_MODEL=1
skips them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(os.environ.get("KVOFFLOAD_SKIP_REAL_MODEL") == "1",
                                                   reason="KVOFFLOAD_SKIP_REAL_MODEL=1")]

SCRIPT = Path(__file__).with_name("real_engine_delays.py")


def run_script(mode: str, hash_seed: str, cwd: Path) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    done = subprocess.run([sys.executable, str(SCRIPT), mode], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr[-6000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("DELAYS "))
    return json.loads(line.removeprefix("DELAYS "))


@pytest.fixture(scope="module")
def slow_stores(tmp_path_factory):
    """Every store copies for half a second, in this interpreter (hash seed already pinned)."""
    return run_script("slow", "0", tmp_path_factory.mktemp("slow"))


@pytest.fixture(scope="module")
def other_hash_seed(tmp_path_factory):
    """The same workload from an interpreter with another hash seed: the engine runs pinned."""
    return run_script("plain", "1", tmp_path_factory.mktemp("seed"))


def test_each_store_is_submitted_one_step_after_its_chunk_was_full(slow_stores):
    assert slow_stores["error"] is None
    # Five full chunks (A: 0, 1 and 2; B: 0 and 1), each submitted one step later. A count of
    # four would miss B's last store (the drain); a 32 would count a decode chunk from the step
    # its block was handed out instead of the step that wrote its last position.
    assert slow_stores["distributions"]["store_submit_delay_steps"] == {"1": 5}
    metrics = slow_stores["metrics"]
    assert (metrics["store_submit_delay_steps_p50"], metrics["store_submit_delay_steps_p99"]) == (1, 1)
    assert "store_visible_delay_steps_p50" not in metrics  # not observable here: absent, not zero


def test_the_run_ends_when_the_last_slow_store_is_reported_not_when_empty_steps_run_out(slow_stores):
    """B's last store copies for half a second after both requests finished; the drain's 200
    empty engine steps take milliseconds. The run waits for the copy, as the vllm-scheduler
    replay does, so no request is left tracked by the copy thread's timing."""
    metrics = slow_stores["metrics"]
    assert metrics["leaked_requests"] == 0 and metrics["stuck_requests"] == 0


def test_another_hash_seed_runs_the_engine_pinned_with_the_same_metrics(slow_stores, other_hash_seed):
    assert other_hash_seed["config"]["python_hash_seed"] == 0
    assert other_hash_seed["settings"]["python_hash_seed"] == 0  # what the engine's process hashed with
    assert slow_stores["settings"]["python_hash_seed"] == 0
    for name in ("store_submit_delay_steps_p50", "prefill_tokens_computed", "offload_hit_rate", "gpu_hit_rate",
                 "output_tokens", "leaked_requests"):
        assert other_hash_seed["metrics"][name] == slow_stores["metrics"][name], name
    assert other_hash_seed["distributions"] == slow_stores["distributions"]
