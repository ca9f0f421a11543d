"""``scripts/gpu-runner``'s own asv stage, run on a CPU against a benchmark that needs no GPU.

Its first GPU run failed here: it passed the relative ``.venv-vllm/bin/python`` to ``asv run -E
existing:...``; asv changes into its config's folder first, selects no environment ("No
environments selected", exit 1), and CI only ever ran the runner's no-GPU branch, which skips asv.
This runs the stage as the runner does (``--only machine,asv``), the interpreter given relative
as the README says to give it, and reads the result it leaves for ``asv_existing.py commit``.
About a minute: asv discovers the suite, then BuildConnectorMeta's samples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("asv")
REPO = Path(__file__).resolve().parents[2]


def test_the_runners_asv_command_line_records_a_result_on_a_cpu(tmp_path):
    out = tmp_path / "visit"
    python = os.path.relpath(sys.executable, REPO)  # relative, as KVOFFLOAD_VLLM_PYTHON's default is
    env = {**os.environ, "KVOFFLOAD_VLLM_PYTHON": python, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    done = subprocess.run([str(REPO / "scripts" / "gpu-runner"), "--only", "machine,asv", "--samples", "1",
                           "--bench", r"bench_connector\.BuildConnectorMeta", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    summary = (out / "summary.txt").read_text().split("\n") if (out / "summary.txt").exists() else []
    assert done.returncode == 0, (summary, done.stderr[-3000:], (out / "asv-1.log").read_text()[-3000:]
                                  if (out / "asv-1.log").exists() else "")
    assert [line.split()[0] for line in summary if line] == ["machine", "asv-config", "asv-1", "asv-adopt"]
    assert "No environments selected" not in (out / "asv-1.log").read_text()

    machine = (out / "machine-name").read_text().strip()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    # named as benchmarks/record-real-model names its results: no interpreter path in name or file
    (result,) = (out / "results" / machine).glob(f"{commit[:8]}-existing-*.json")
    assert result.name == f"{commit[:8]}-existing-python.json"  # this interpreter has no vLLM
    text = result.read_text()
    assert str(REPO) not in text and python not in text
    data = json.loads(text)
    assert data["env_name"] == "existing-python" and data["commit_hash"] == commit
    (row,) = [row for name, row in data["results"].items() if name.endswith("BuildConnectorMeta.track_us_per_step")]
    assert all(value > 0 for value in row[0])  # a value per blocks_per_chunk
    suite = json.loads((out / "results" / "benchmarks.json").read_text())
    assert "bench_connector.BuildConnectorMeta.track_us_per_step" in suite
    assert json.loads((out / "results" / machine / "machine.json").read_text())["machine"] == machine
    assert done.stdout.splitlines()[-1] == (f"gpu-runner: commit them with: .venv/bin/python "
                                            f"scripts/asv_existing.py commit {out / 'results'}")


def sandbox(tmp_path: Path) -> Path:
    """A repository with the scripts `asv_existing.py commit` runs, a committed cpu-2core folder,
    and a main branch (first-parent-line reads it)."""
    root = tmp_path / "repo"
    for script in ("scripts/asv_existing.py", "scripts/asv_machine.py", "benchmarks/first-parent-line"):
        (root / script).parent.mkdir(parents=True, exist_ok=True)
        (root / script).write_bytes((REPO / script).read_bytes())
        (root / script).chmod(0o755)
    (root / "benchmarks" / "bench_workloads.py").write_text("")
    folder = root / "results" / "asv" / "gpu-h200"
    folder.mkdir(parents=True)
    (folder / "machine.json").write_text(json.dumps({"machine": "gpu-h200", "cpu": "AMD EPYC", "num_cpu": "32",
                                                     "ram": "1000.0 GiB", "gpu": "NVIDIA H200 (x1)"}))
    (root / "results" / "asv" / "benchmarks.json").write_text(json.dumps({"version": 2, "old.bench": {}}))
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-q", "-m", "c1")):
        subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True, timeout=60)
    return root


def runner_results(tmp_path: Path, cpu: str) -> Path:
    results = tmp_path / "visit" / "results"
    (results / "gpu-h200").mkdir(parents=True)
    (results / "gpu-h200" / "machine.json").write_text(json.dumps(
        {"machine": "gpu-h200", "cpu": cpu, "num_cpu": "32", "ram": "1000.0 GiB", "gpu": "NVIDIA H200 (x1)"}))
    (results / "gpu-h200" / "abcdef12-existing-vllm.json").write_text('{"results": {}}')
    (results / "benchmarks.json").write_text(json.dumps({"version": 2, "bench_real_model.RealModel.x": {"unit": "s"}}))
    return results


def commit_results(root: Path, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "scripts" / "asv_existing.py"), "commit", str(results)], cwd=root,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def test_the_one_command_commits_a_runners_results_and_results_asv_only(tmp_path):
    root = sandbox(tmp_path)
    (root / "notes.txt").write_text("not the runner's")
    done = commit_results(root, runner_results(tmp_path, "AMD EPYC"))
    assert done.returncode == 0, done.stderr
    shown = subprocess.run(["git", "-C", str(root), "show", "--name-only", "--format=", "HEAD"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert "results/asv/gpu-h200/abcdef12-existing-vllm.json" in shown and "notes.txt" not in shown
    assert all(path.startswith("results/asv/") for path in shown)
    suite = json.loads((root / "results" / "asv" / "benchmarks.json").read_text())
    assert set(suite) == {"version", "old.bench", "bench_real_model.RealModel.x"}  # merged, nothing lost


def test_the_one_command_refuses_another_machines_hardware_under_the_same_name(tmp_path):
    root = sandbox(tmp_path)
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    done = commit_results(root, runner_results(tmp_path, "Intel Xeon"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "describes AMD EPYC" in lines[0] and "Intel Xeon" in lines[0]
    assert not (root / "results" / "asv" / "gpu-h200" / "abcdef12-existing-vllm.json").exists()
    assert subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout == head
