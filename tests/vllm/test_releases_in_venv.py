"""What ``kvoffload releases`` gets from a real release venv (issue 31): ``kvoffload.vllm.rows``
keeps a ``mooncake:FILE`` workload whole (it was split at its first colon) and prints rows the
parent's check (``release_io.parse_rows``) accepts; and on the vLLM engines a connector vLLM
cannot load is refused in one line, vLLM's import-time warnings held back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.release_io import parse_rows  # noqa: E402
from kvoffload.vllm import rows  # noqa: E402

TRACE = [{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]},
         {"timestamp": 200, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}]


@pytest.mark.vllm_on_demand  # a replay through vLLM's scheduler: 28 s at load 6; the split itself is
# test_releases_hardened's test_a_job_is_split_at_its_last_colon, in the main suite
def test_rows_keeps_a_mooncake_workload_whole_and_prints_what_releases_accepts(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in TRACE))
    workload = f"mooncake:{trace}"
    assert rows.main([f"{workload}:async"]) == 0
    printed = capsys.readouterr().out
    (row,) = parse_rows("this release", printed, [(workload, "async")])
    assert "setup_error" not in row, row.get("setup_error")
    assert row["workload"] == workload and row["metrics"]["requests"] == 2


@pytest.mark.vllm_on_demand  # a vLLM import of its own: 15-20 s
def test_a_connector_vllm_cannot_load_is_the_only_line_on_stderr(tmp_path):
    """The module is there, the class is not: only vLLM's loader can tell, after vLLM's import,
    whose warnings (Triton's on a CPU) came first before issue 31."""
    done = subprocess.run([sys.executable, "-m", "kvoffload.cli", "run", "--quiet", "--workload", "multi-turn-small",
                           "--engine", "vllm-scheduler", "--connector", "json:NoSuchConnector", "--out", "r.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    assert done.stderr == ("kvoffload: error: cannot load connector 'NoSuchConnector' from json: Class "
                           "NoSuchConnector not found in json\n")
    assert not (tmp_path / "r.json").exists()
