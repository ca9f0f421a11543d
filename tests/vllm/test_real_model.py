"""The output oracle on vLLM's real engine and a real model (the tiny Llama, seeded weights).

Three engine starts in one subprocess (offload off, the reference, the reference with
final_token_watermark off) on the 12-request boundary-turns workload: 44 s of CPU, 2.7 minutes
of wall time on 2 cores at load 15 and 5.4 at load 28 (docs/vllm.md, "A real model: --engine vllm"),
so it runs in CI's vLLM stage; KVOFFLOAD_SKIP_REAL_MODEL=1 skips it.
"""

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


@pytest.fixture(scope="module")
def oracle_runs(tmp_path_factory):
    script = Path(__file__).with_name("real_model_oracle.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path_factory.mktemp("oracle"))
    assert done.returncode == 0, done.stderr[-6000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("ORACLE "))
    return json.loads(line.removeprefix("ORACLE "))


def test_the_reference_connector_changes_no_output_token(oracle_runs):
    reference = oracle_runs["reference"]
    assert reference["error"] is None
    oracle = reference["oracle"]
    assert oracle["compared"] == 12 and oracle["identical"] == 12, oracle["mismatches"]
    # every follow-up took its parent's history from the GPU cache or the host tier
    assert reference["metrics"]["prefill_tokens_computed"] < oracle_runs["off"]["metrics"]["prefill_tokens_computed"]


def test_the_watermark_bug_changes_what_the_model_says(oracle_runs):
    """Each answer ends on a chunk boundary: without the watermark the connector stores that chunk
    with its final position never computed, and the follow-up loads it (docs/engine.md)."""
    broken = oracle_runs["broken"]
    assert broken["error"] is None
    oracle = broken["oracle"]
    first = oracle["first_mismatch"]
    assert first is not None, "the oracle missed a connector that loads a never-computed position"
    assert first["request"].endswith("-t01") and first["position"] == 0  # a second turn, its first token
    # Chunk 1 holds positions 32-63 of the 64-token first turn, its last position never computed.
    assert first["loaded_chunks"] == [1]
    assert oracle["identical"] == 4  # the first turns load nothing: untouched


def test_the_runs_are_measured_on_the_engine_that_ran(oracle_runs):
    settings = oracle_runs["reference"]["settings"]
    assert (settings["block_size"], settings["blocks_per_chunk"]) in ((32, 1), (16, 2))
    assert settings["speculative"] is None and settings["arrivals"] == "engine iterations"
    metrics = oracle_runs["reference"]["metrics"]
    assert metrics["output_tokens_per_s"] > 0 and metrics["ttft_ms_p50"] > 0 and metrics["tpot_ms_p50"] > 0
    assert oracle_runs["off"]["settings"]["prefix_caching"] is False
