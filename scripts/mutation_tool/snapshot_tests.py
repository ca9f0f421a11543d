"""The tests/ the snapshot's mutants run against: the snapshot commit's own (what the rest of CI
ran then), or those with this branch's new tests on top (the ``new`` stage); and the tests left
out of every run because they fail unmutated (``meta.json``'s ``deselect``)."""

from __future__ import annotations

import json
import shutil
import subprocess

from places import ROOT, TREE, WORK


def snapshot_tests() -> None:
    """The snapshot's tests/ exactly as its commit had them: what the rest of CI (main, gate, vLLM)
    ran then. The branch's newer test files may test code newer than the snapshot and fail on it."""
    commit = json.loads((WORK / "meta.json").read_text())["commit"]
    shutil.rmtree(TREE / "tests", ignore_errors=True)
    archive = subprocess.run(["git", "archive", commit, "tests"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(TREE)], input=archive, check=True)


def refresh_tests() -> list[str]:
    """The snapshot's tests/: those of the snapshot's commit, with the files of the tests written
    for its survivors (``fates.NEW_TESTS``, what the ``new`` stage runs) and this worktree's new
    test files on top, as they are now. Only those: other test files main changed since may test
    code the snapshot lacks. Returns the files overlaid."""
    commit = json.loads((WORK / "meta.json").read_text())["commit"]
    shutil.rmtree(TREE / "tests", ignore_errors=True)
    archive = subprocess.run(["git", "archive", commit, "tests"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(TREE)], input=archive, check=True)
    overlay = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "tests"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    from fates import NEW_TESTS
    overlay = sorted(set(overlay) | {test.split("::")[0] for tests in NEW_TESTS.values() for test in tests})
    for name in overlay:
        source, target = ROOT / name, TREE / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        else:
            target.unlink(missing_ok=True)
    return overlay


def deselected() -> list[str]:
    meta_path = WORK / "meta.json"
    return json.loads(meta_path.read_text()).get("deselect", []) if meta_path.exists() else []
