"""One machine name, one machine: the hardware (CPU model, cores, memory, GPU) is a machine's
identity. ``benchmarks/record`` refuses a folder whose machine.json describes other hardware, the
committed history keeps each folder to one hardware, and the report never joins two on a line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "asv_machine.py"
spec = importlib.util.spec_from_file_location("asv_machine", SCRIPT)
asv_machine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(asv_machine)

AMD = {"cpu": "AMD EPYC", "num_cpu": "2", "ram": "23.5 GiB"}


@pytest.mark.parametrize("other, same", [
    (AMD, True),
    ({**AMD, "ram": "23.9 GiB"}, True),  # within 3 %: the kernel's share moves between boots
    ({**AMD, "ram": "31.3 GiB"}, False),
    ({**AMD, "num_cpu": "4"}, False),
    ({**AMD, "cpu": "Intel Xeon"}, False),
    ({**AMD, "gpu": "NVIDIA H200 (x1)"}, False),
    ({"machine": "cpu-2core"}, False),  # a machine.json that describes no hardware
])
def test_the_same_hardware_is_the_same_cpu_cores_gpu_and_memory(other, same):
    assert asv_machine.same_hardware(AMD, other) is same


def test_record_refuses_a_folder_that_describes_other_hardware_in_one_line(tmp_path):
    """The issue's story: record on an Intel runner rewrote cpu-2core's AMD machine.json. Here the
    folder describes hardware this machine is not; nothing runs, nothing is written."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "scripts").mkdir()
    for name in ("record", "first-parent-line"):
        (root / "benchmarks" / name).write_bytes((REPO / "benchmarks" / name).read_bytes())
        (root / "benchmarks" / name).chmod(0o755)
    (root / "scripts" / "asv_machine.py").write_bytes(SCRIPT.read_bytes())
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").symlink_to(sys.executable)
    folder = root / "results" / "asv" / "cpu-2core"
    folder.mkdir(parents=True)
    elsewhere = {"machine": "cpu-2core", "cpu": "No Such CPU 9000", "num_cpu": "2", "ram": "23.5 GiB", "version": 1}
    (folder / "machine.json").write_text(json.dumps(elsewhere))
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    done = subprocess.run([str(root / "benchmarks" / "record"), "HEAD"], cwd=root, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "ASV": "/bin/false"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    here = asv_machine.shown(asv_machine.this_hardware())
    assert f"describes No Such CPU 9000, 2 cores, 23.5 GiB; this machine is {here}" in lines[0]
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def machine_folders() -> list[Path]:
    return sorted(p for p in (REPO / "results" / "asv").iterdir() if p.is_dir())


@pytest.mark.parametrize("folder", machine_folders(), ids=lambda p: p.name)
def test_every_committed_result_names_the_hardware_of_its_folder(folder):
    """Each result file's own record of its hardware (asv's params) is its folder's machine.json;
    a folder whose machine.json describes none holds only results that name none."""
    described = json.loads((folder / "machine.json").read_text())
    for path in sorted(folder.glob("*.json")):
        if path.name == "machine.json":
            continue
        params = json.loads(path.read_text())["params"]
        assert params["machine"] == folder.name, path.name
        if "cpu" in described:
            assert asv_machine.same_hardware(described, params), path.name
        else:
            assert not asv_machine.hardware(params), path.name


def test_the_report_draws_two_hardwares_of_one_name_as_two_lines(tmp_path):
    """A folder appended to from two machines (before record refused it): two lines, each named."""
    from kvoffload.report.history import draw_asv_history
    from kvoffload.report.sources import find_asv_points

    folder = tmp_path / "asv" / "box"
    folder.mkdir(parents=True)
    columns = ["result", "params", "version"]
    for commit, date, cpu, value in (("a" * 40, 1, "AMD EPYC", 100.0), ("b" * 40, 2, "Intel Xeon", 300.0)):
        (folder / f"{commit[:8]}-env.json").write_text(json.dumps({
            "commit_hash": commit, "env_name": "env", "date": date, "result_columns": columns,
            "params": {"machine": "box", "cpu": cpu, "num_cpu": "2", "ram": "16.0 GiB"},
            "results": {"bench_connector.BuildConnectorMeta.track_us_per_step": [[value], [["1"]], "2"]}}))
    points, _ = find_asv_points(tmp_path / "asv")
    (chart,) = draw_asv_history(points, {"bench_connector.BuildConnectorMeta.track_us_per_step": "µs/step"}, tmp_path)
    assert "box [AMD EPYC, 2 cores, 16.0 GiB]" in chart.caption and "box [Intel Xeon, 2 cores, 16.0 GiB]" in chart.caption
