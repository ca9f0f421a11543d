"""``benchmarks/publish --releases``: the committed release table changes only through publish,
from a clean commit, with the rows it did not measure kept. kvoffload and python are stand-ins
that log their command lines (the real releases need one venv per vLLM release)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# `kvoffload releases --out FILE ...` as the stand-in runs it: the table it found in FILE (the
# committed one, copied) with this run's row added, as the real command merges.
KVOFFLOAD = r"""#!/bin/sh
echo "kvoffload $*" >> "$(dirname "$0")/../../calls.log"
if [ "$1" = releases ]; then
    [ "$2" = --out ] || exit 9
    { printf '{"earlier": '; cat "$3" 2>/dev/null || printf null; printf ', "measured": "%s"}\n' "$5"; } > "$3.new"
    mv "$3.new" "$3"
    [ "$5" = 0.99.0 ] && exit 2
fi
exit 0
"""
PYTHON = """#!/bin/sh
echo "python $*" >> "$(dirname "$0")/../../calls.log"
"""


def clean_checkout(tmp_path: Path, table: dict | None) -> Path:
    """A git repository holding benchmarks/ (and the committed release table), committed: clean."""
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in (("kvoffload", KVOFFLOAD), ("python", PYTHON)):
        script = tmp_path / ".venv" / "bin" / name
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
        script.chmod(0o755)
    if table is not None:
        (tmp_path / "results" / "releases").mkdir(parents=True)
        (tmp_path / "results" / "releases" / "releases.json").write_text(json.dumps(table))
    (tmp_path / ".gitignore").write_text(".venv/\ncalls.log\n")
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "-m", "clean")):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)
    return tmp_path


def publish(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(folder / "benchmarks" / "publish"), *args], capture_output=True, text=True, timeout=60)


def test_publish_releases_merges_into_the_committed_table_and_redraws(tmp_path):
    folder = clean_checkout(tmp_path, {"rows": "of 0.25.0, measured earlier"})
    done = publish(folder, "--releases", "--release", "0.29.0", "--full")
    assert done.returncode == 0, done.stderr
    table = json.loads((folder / "results" / "releases" / "releases.json").read_text())
    # the command merged into a copy of the committed table: the earlier rows stay
    assert table == {"earlier": {"rows": "of 0.25.0, measured earlier"}, "measured": "0.29.0"}
    calls = (folder / "calls.log").read_text().splitlines()
    assert calls[0].startswith("kvoffload releases --out /") and calls[0].endswith(" --release 0.29.0 --full")
    scratch = Path(calls[0].split()[3])
    assert not scratch.parent.exists()  # the scratch folder is gone
    assert "kvoffload report --from results --out results/charts" in calls
    assert "python scripts/readme_tables.py" in calls  # docs/releases.md's release tables follow the file
    assert "release table updated from" in done.stdout


def test_publish_releases_leaves_the_committed_table_alone_when_the_run_fails(tmp_path):
    folder = clean_checkout(tmp_path, {"rows": "committed"})
    done = publish(folder, "--releases", "--release", "0.99.0")
    assert done.returncode == 2
    assert json.loads((folder / "results" / "releases" / "releases.json").read_text()) == {"rows": "committed"}
    (call,) = (folder / "calls.log").read_text().splitlines()  # no charts, no generated tables
    assert call.startswith("kvoffload releases --out ") and call.endswith(" --release 0.99.0")
    assert not Path(call.split()[3]).parent.exists()


def test_publish_releases_writes_the_first_table_and_refuses_another_target(tmp_path):
    folder = clean_checkout(tmp_path, None)
    assert publish(folder, "--releases", "--release", "0.32.0").returncode == 0
    assert json.loads((folder / "results" / "releases" / "releases.json").read_text()) == {
        "earlier": None, "measured": "0.32.0"}
    subprocess.run(["git", "-C", str(folder), "add", "results"], check=True)
    subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m",
                    "published"], check=True)
    refused = publish(folder, "--releases", "--out", "elsewhere.json")
    assert refused.returncode == 2 and "no --out" in refused.stderr
    assert not (folder / "elsewhere.json").exists()


def test_publish_releases_refuses_a_tree_with_changes(tmp_path):
    folder = clean_checkout(tmp_path, {"rows": "committed"})
    (folder / "results" / "releases" / "releases.json").write_text('{"rows": "edited by hand"}')
    done = publish(folder, "--releases")
    assert done.returncode == 2 and "tracked files differ from HEAD" in done.stderr
    assert not (folder / "calls.log").exists()  # nothing ran
