"""scripts/asv_machine.py: the machine entry asv copies into results/asv/<machine>/machine.json."""

from __future__ import annotations

import json
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
