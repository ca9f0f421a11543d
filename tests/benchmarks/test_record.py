"""benchmarks/record on a small repository of its own, with asv played by a script ($ASV).

The story: main has six commits, the first before the suite existed, two that leave the package as
their first parent had it, one whose package yields no value at all. A catch-up cut to two commits
records the newest and the oldest of those that changed the package (coarse to fine) and commits
each one's results alone; a later call finds the commit cut short last time, records it again,
then the commits with their parent's package, lists the broken one as skipped, and commits that
too. Nothing outside results/asv/ is ever committed, whatever else the tree holds, and a call
with nothing to record leaves the tree as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MACHINE = "test-machine"

# asv as record calls it: `setup` makes the environment's python, `run ... SHA^!` writes one result
# file (every value null for a commit whose subject says "broken": its package cannot serve the suite).
FAKE_ASV = """#!/usr/bin/env bash
set -euo pipefail
case $1 in
    setup) mkdir -p .asv/env/fake/bin && ln -sf "$(command -v python3)" .asv/env/fake/bin/python; exit 0 ;;
    run) ;;
    *) exit 2 ;;
esac
rev=${@: -1}; sha=$(git rev-parse "${rev%^!}")
echo "$sha" >> asv-calls.log
value=1.0; git log -1 --format=%s "$sha" | grep -q broken && value=null
mkdir -p results/asv/test-machine
echo '{"version": 2}' > results/asv/benchmarks.json
printf '{"results": {"bench_workloads.TrackMultiTurn.track_crashes": [[%s, %s]]}}' "$value" "$value" \\
    > "results/asv/test-machine/${sha:0:8}-virtualenv-fake.json"
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


@pytest.fixture
def repo(tmp_path):
    """A repository with record, a stub machine script, no intended changes and six commits on main,
    checked out on a branch of its own."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    for script in ("record", "first-parent-line"):
        shutil.copy(REPO / "benchmarks" / script, root / "benchmarks" / script)
    (root / "scripts").mkdir()
    (root / "scripts" / "asv_machine.py").write_text("")  # the real one writes ~/.asv-machine.json
    (root / "reference" / "kvoffload" / "report").mkdir(parents=True)
    (root / "reference" / "kvoffload" / "report" / "changes.csv").write_text("commit,metric,version,reason\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").symlink_to(sys.executable)
    asv = tmp_path / "asv"
    asv.write_text(FAKE_ASV)
    asv.chmod(asv.stat().st_mode | stat.S_IXUSR)
    (root / ".gitignore").write_text(".venv\n.asv/\nasv-calls.log\nresults/asv/*/.recording\n")
    (root / "README").write_text("before the suite\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.org")
    git(root, "config", "user.name", "t")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "c1 no suite yet")
    (root / "benchmarks" / "bench_workloads.py").write_text("")
    for subject in ("c2 suite", "c3 broken package", "c4", "c5", "c6 tip"):
        (root / "README").write_text(subject + "\n")
        if subject[:2] in ("c2", "c4", "c6"):  # these change the package; c3 and c5 only the README
            (root / "reference" / "kvoffload" / "code.py").write_text(f"# {subject}\n")
        git(root, "add", "-A")
        git(root, "commit", "-qm", subject)
    git(root, "switch", "-qc", "work")  # results are committed on a branch, as a runner's are before a merge
    return root


def record(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASV": str(repo.parent / "asv")}
    return subprocess.run([str(repo / "benchmarks" / "record"), "--machine", MACHINE, *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)


def short(repo: Path, subject: str) -> str:
    return git(repo, "log", "--format=%h", "--abbrev=8", f"--grep=^{subject}", "main").strip()


def committed_paths(repo: Path, commit: str) -> set[str]:
    return set(git(repo, "show", "--name-only", "--format=", commit).split())


def test_a_catch_up_commits_each_recorded_commit_alone_coarse_to_fine_and_resumes(repo):
    (repo / "README").write_text("an edit nobody committed\n")
    (repo / "notes.txt").write_text("untracked\n")
    tip = git(repo, "rev-parse", "main").strip()
    # the real model's result of c4 (benchmarks/record-real-model): not this suite's, so c4 is missing
    c4 = short(repo, "c4")
    real_model = repo / "results" / "asv" / MACHINE / f"{c4}-existing-vllm.json"
    real_model.parent.mkdir(parents=True)
    real_model.write_text('{"results": {}}')

    first = record(repo, "--limit", "2", "--commit")
    assert first.returncode == 0, first.stderr
    assert ("6 commit(s) asked; 1 before the suite existed, 0 already recorded, 0 listed in "
            f"results/asv/{MACHINE}/skipped.txt; 2 to record (of 5 missing, 2 of them with their first "
            "parent's package: recorded last)") in first.stdout
    # coarse to fine among the commits that changed the package: the newest, then every 16th from the oldest
    recorded = [line.strip()[:8] for line in (repo / "asv-calls.log").read_text().splitlines()]
    assert recorded == [short(repo, "c6"), short(repo, "c2")]
    results_commits = git(repo, "rev-list", f"{tip}..HEAD").split()
    assert len(results_commits) == 2
    for commit in results_commits:
        assert all(path.startswith("results/asv/") for path in committed_paths(repo, commit))
    assert git(repo, "status", "--porcelain", "--", "README", "notes.txt").split() == ["M", "README", "??",
                                                                                       "notes.txt"]

    # c4 was being recorded when the last call was stopped: its partial result is not a result
    partial = repo / "results" / "asv" / MACHINE / f"{c4}-virtualenv-fake.json"
    partial.write_text("{}")
    (repo / "results" / "asv" / MACHINE / ".recording").write_text(c4 + "\n")

    second = record(repo, "--commit")
    assert second.returncode == 0, second.stderr
    assert f"{c4} was cut short last time; recording it again" in second.stdout
    assert "3 to record (of 3 missing, 2 of them" in second.stdout
    calls = [line.strip()[:8] for line in (repo / "asv-calls.log").read_text().splitlines()]
    assert calls[2:] == [c4, short(repo, "c5"), short(repo, "c3")]  # the package's change first
    assert json.loads(partial.read_text())["results"]  # recorded again, whole
    assert real_model.read_text() == '{"results": {}}'  # the real model's result is left alone
    broken = short(repo, "c3 broken")
    assert (repo / "results" / "asv" / MACHINE / "skipped.txt").read_text().startswith(f"{broken} no benchmark")
    assert not list((repo / "results" / "asv" / MACHINE).glob(f"{broken}-*.json"))
    assert "1 newly skipped (no value), 0 left for a later call" in second.stdout
    later = git(repo, "rev-list", f"{results_commits[0]}..HEAD").split()
    assert len(later) == 3  # c5 and c4 recorded, c3 skipped: each committed alone
    assert all(path.startswith("results/asv/") for commit in later for path in committed_paths(repo, commit))
    assert git(repo, "status", "--porcelain", "--", "results").strip() == ""  # nothing left uncommitted

    third = record(repo, "--commit")  # caught up: nothing to record, nothing committed
    assert "0 to record (of 0 missing, 0 of them" in third.stdout and f"passed over: {broken}" in third.stdout
    assert git(repo, "rev-parse", "HEAD") == git(repo, "rev-parse", later[0])

    # The results reach main; a call that finds nothing to record (here: a commit already
    # recorded) writes nothing, not even the first-parent line, which now has commits to add.
    git(repo, "switch", "-q", "main")
    git(repo, "merge", "-q", "--ff-only", "work")
    fourth = record(repo, short(repo, "c6"))
    assert fourth.returncode == 0 and "0 to record" in fourth.stdout, fourth.stderr
    assert git(repo, "status", "--porcelain", "--", "results").strip() == ""


def test_unknown_options_and_bad_counts_exit_2_in_one_line(repo):
    for args in (["--limit", "x"], ["--frobnicate"], ["no-such-commit"]):
        result = record(repo, *args)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
