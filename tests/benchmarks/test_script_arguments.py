"""The scripts under benchmarks/ and scripts/ read their arguments strictly, before any work: an
unknown or extra argument, a flag without its value, or a machine name that is a path is one line
on stderr and exit 2, and nothing is run or written.

The shell scripts run in a sandbox: a copy of benchmarks/ and scripts/ in a git repository of
its own, with kvoffload, python and asv played by scripts that log their command lines, so a
script that ran on past its arguments (``scripts/setup`` installing, ``publish`` drawing) shows
as a logged call or a written file, not as work done in this checkout. The Python scripts refuse
before they import anything heavy or write anything, so they run where they are.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAND_IN = """#!/bin/sh
echo "$(basename "$0") $*" >> "$(dirname "$0")/../../calls.log"
"""


@pytest.fixture
def sandbox(tmp_path):
    """A clean git repository holding copies of benchmarks/ and scripts/, inside an otherwise
    empty folder (so a write outside the repository shows there)."""
    root = tmp_path / "repo"
    for folder in ("benchmarks", "scripts"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("kvoffload", "python", "asv"):
        stand_in = root / ".venv" / "bin" / name
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text(STAND_IN)
        stand_in.chmod(0o755)
    (root / ".gitignore").write_text(".venv/\ncalls.log\n")
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-q", "-m", "clean")):
        subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True, timeout=60)
    return root


def refused(root: Path, script: str, *args: str) -> str:
    """Run ``script args`` in the sandbox; assert it was refused in one line with nothing run or
    written, and return that line."""
    done = subprocess.run([str(root / script), *args], cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(root.parent)})
    lines = done.stderr.strip().splitlines()
    assert (done.returncode, len(lines)) == (2, 1), (script, args, done.returncode, done.stderr[-2000:])
    assert not (root / "calls.log").exists(), (root / "calls.log").read_text()
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--ignored", "--", "."],
                            capture_output=True, text=True, timeout=60).stdout.split("\n")
    assert [line for line in status if line and not line.endswith(".venv/")] == []
    assert sorted(path.name for path in root.parent.iterdir()) == ["repo"]  # nothing beside the repository
    return lines[0]


@pytest.mark.parametrize("args, said", [
    (("--charts", "--bogus"), "unknown argument --bogus"),
    (("--machine", "x", "--charts"), "--machine x with --charts"),
    (("--machine",), "--machine needs a NAME"),
    (("--machine", "--charts"), "--machine needs a NAME"),
    (("--machine", "a", "--machine", "b"), "--machine given twice"),
    (("--machine", "../up"), "--machine ../up: expected a name"),
    (("--charts", "--releases"), "--releases with --charts"),
    (("extra",), "unknown argument extra"),
])
def test_publish_refuses_what_it_does_not_know_before_any_work(sandbox, args, said):
    """On main before issue 31, --charts --bogus drew the charts, --machine x --charts started the
    full publish (the gate baseline first), and --machine alone exited 1 with bash's message."""
    assert said in refused(sandbox, "benchmarks/publish", *args)


@pytest.mark.parametrize("script", ["benchmarks/record", "benchmarks/record-real-model"])
@pytest.mark.parametrize("machine", ["../../..", "a/b", ".hidden", "--commit", ""])
def test_a_machine_name_is_a_folder_name_never_a_path(sandbox, script, machine):
    """``record --machine ../../..`` wrote results/asv/../../.. (outside the repository) and
    exited 1 with no message."""
    line = refused(sandbox, script, "--machine", machine)
    assert "--machine" in line


@pytest.mark.parametrize("script, args", [
    ("scripts/setup", ("--bogus",)),
    ("scripts/setup-vllm", ("0.29.0", "extra")),
    ("scripts/vllm-on-demand", (".venv-vllm", "extra")),
    ("scripts/packaged-gates", (".venv-vllm", "extra")),
    ("scripts/gpu-runner", ("--bogus",)),
    ("scripts/grade-connectors", ("--bogus",)),
    ("benchmarks/first-parent-line", ("extra",)),
    ("benchmarks/record", ("--bogus",)),
    ("benchmarks/record-real-model", ("--bogus",)),
    ("benchmarks/publish", ("--bogus",)),
])
def test_every_shell_script_refuses_an_unknown_argument_in_one_line(sandbox, script, args):
    refused(sandbox, script, *args)


PYTHON_SCRIPTS = [
    ("scripts/measure_transfer.py", ("--bogus",)),
    ("scripts/measure_transfer.py", ("--repeats", "0")),
    ("scripts/measure_scaling.py", ("--bogus",)),
    ("scripts/measure_replay_speed.py", ("--tree", "a=b", "--pairs", "x")),
    ("scripts/readme_tables.py", ("--bogus",)),
    ("scripts/asv_machine.py", ("--bogus", "python")),
    ("scripts/asv_existing.py", ("--bogus",)),
    ("scripts/asv_existing.py", ("commit",)),
    ("scripts/gates_table", ("--bogus",)),
    ("scripts/gates_table", ("--matrix", "no-such-folder")),
    ("scripts/connectors_table", ("--bogus",)),
    ("scripts/connectors_table", ("a.json", "extra")),
    ("scripts/connectors_table", ("no-such-table.json",)),
    ("scripts/mutation", ("--bogus",)),
    ("scripts/mutation_tool", ("exec", "--bogus")),
    ("benchmarks/bench_connector.py", ("extra",)),
    ("benchmarks/bench_transfer.py", ("extra",)),
]


@pytest.mark.parametrize("script, args", PYTHON_SCRIPTS, ids=[" ".join((s, *a)) for s, a in PYTHON_SCRIPTS])
def test_every_python_script_refuses_in_one_line(script, args):
    """argparse's own refusal is its usage block and the error: two lines or more."""
    done = subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    lines = done.stderr.strip().splitlines()
    assert (done.returncode, len(lines)) == (2, 1), done.stderr[-2000:]


def test_every_script_is_in_one_of_these_lists():
    """A new script joins the lists above (and so the contract)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-s", "benchmarks", "scripts"], capture_output=True,
                            text=True, check=True, timeout=60).stdout.splitlines()
    executable = {line.split("\t")[1] for line in listed if line.startswith("100755")}
    mains = {str(path.relative_to(REPO)) for folder in ("benchmarks", "scripts")
             for path in (REPO / folder).glob("*.py") if '__name__ == "__main__"' in path.read_text()}
    packages = {str(path.parent.relative_to(REPO)) for path in (REPO / "scripts").glob("*/__main__.py")}
    covered = {script for script, _ in PYTHON_SCRIPTS} | {
        "scripts/setup", "scripts/setup-vllm", "scripts/vllm-on-demand", "scripts/packaged-gates", "scripts/gpu-runner",
        "scripts/grade-connectors",
        "benchmarks/first-parent-line", "benchmarks/record", "benchmarks/record-real-model", "benchmarks/publish"}
    assert (executable | mains | packages) - covered == set()
