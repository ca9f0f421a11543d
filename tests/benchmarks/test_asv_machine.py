"""scripts/asv_machine.py: the machine entry asv copies into results/asv/<machine>/machine.json."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "asv_machine.py"


def test_the_entry_describes_cpu_memory_os_python_and_torch_and_keeps_other_machines(tmp_path):
    machine_file = tmp_path / "asv-machine.json"
    machine_file.write_text(json.dumps({"version": 1, "other": {"machine": "other", "cpu": "kept"}}))
    subprocess.run([sys.executable, str(SCRIPT), "ci-2core", sys.executable, str(machine_file)], check=True,
                   capture_output=True, timeout=300)
    entries = json.loads(machine_file.read_text())
    entry = entries["ci-2core"]
    assert entries["other"] == {"machine": "other", "cpu": "kept"} and entries["version"] == 1
    assert entry["machine"] == "ci-2core" and entry["arch"] == platform.machine()
    assert entry["cpu"] and int(entry["num_cpu"]) >= 1 and entry["ram"].endswith(" GiB")
    assert platform.system() in entry["os"]
    assert entry["python"] == platform.python_version()  # the interpreter it was given, not its own
    import torch

    assert entry["torch"] == torch.__version__
    assert all(isinstance(v, str) for v in entry.values())  # asv's fields are strings


def test_a_wrong_call_is_a_usage_line(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "asv_machine.py NAME ENV_PYTHON" in result.stderr


def test_a_gpu_runner_adds_its_gpus_driver_and_cuda(tmp_path):
    """On a GPU runner nvidia-smi lists one row per GPU (name, driver) and the environment's torch
    names its CUDA: here both are played by scripts, two H200s on driver 570.86."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA H200, 570.86.15\\nNVIDIA H200, 570.86.15\\n'\n")
    env_python = tmp_path / "env-python"
    env_python.write_text('#!/bin/sh\necho \'{"python": "3.12.3", "torch": "2.13.0+cu128", "cuda": "12.8"}\'\n')
    for script in (smi, env_python):
        script.chmod(0o755)
    machine_file = tmp_path / "asv-machine.json"
    subprocess.run([sys.executable, str(SCRIPT), "gpu-h200", str(env_python), str(machine_file)], check=True,
                   capture_output=True, timeout=300, env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    entry = json.loads(machine_file.read_text())["gpu-h200"]
    assert (entry["gpu"], entry["gpu_driver"], entry["cuda"]) == ("NVIDIA H200 (x2)", "570.86.15", "12.8")
    assert (entry["python"], entry["torch"]) == ("3.12.3", "2.13.0+cu128")


def test_a_cpu_runner_has_no_gpu_fields(tmp_path):
    """Without nvidia-smi on the PATH the entry names no GPU, driver or CUDA (not empty strings)."""
    env_python = tmp_path / "env-python"
    env_python.write_text('#!/bin/sh\necho \'{"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": null}\'\n')
    env_python.chmod(0o755)
    machine_file = tmp_path / "asv-machine.json"
    subprocess.run([sys.executable, str(SCRIPT), "cpu", str(env_python), str(machine_file)], check=True,
                   capture_output=True, timeout=300, env={**os.environ, "PATH": str(tmp_path)})
    entry = json.loads(machine_file.read_text())["cpu"]
    assert not {"gpu", "gpu_driver", "cuda"} & entry.keys()
