"""``scripts/gpu-runner`` on a machine without a GPU: it records the machine and runs the CPU
transfer benchmark, skips what needs CUDA, says so in one line and exits 0 (docs/vllm.md,
"GPU runners"). About 30 s idle (the transfer benchmark), 90 s at load 17."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("asv")
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                                                   reason="a GPU machine runs the whole runner")]

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_gpu_the_runner_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "visit"
    env = dict(os.environ, KVOFFLOAD_VLLM_PYTHON=sys.executable)
    done = subprocess.run([str(ROOT / "scripts" / "gpu-runner"), "--out", str(out)], capture_output=True, text=True,
                          timeout=900, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-runner: no GPU present"), done.stdout
    assert (out / "summary.txt").read_text().split() == ["machine", "0", "transfer", "0"]
    assert "GiB/s" in (out / "transfer.log").read_text()
    name = (out / "machine-name").read_text().strip()
    assert name.startswith("cpu-") and name.endswith("core"), name  # the CPU machine's asv name
