"""Where the tool works: the repository, its work folder ``.mutation/`` (ignored by git), the
snapshot of the tree inside it that mutants are planted in, and where its report goes.

``KVOFFLOAD_MUTATION_SET=whole`` selects the run over the rest of the package (issue 29,
``targets_whole.py``): its own work folder ``.mutation-whole/`` and report
``results/mutation/tool/whole/``, beside the first run's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SET = os.environ.get("KVOFFLOAD_MUTATION_SET", "first")
if SET not in ("first", "whole"):
    raise SystemExit(f"KVOFFLOAD_MUTATION_SET={SET}: expected first or whole")
WORK = ROOT / (".mutation" if SET == "first" else ".mutation-whole")
RESULTS = ROOT / "results" / "mutation" / "tool" / ("" if SET == "first" else "whole")
# KVOFFLOAD_MUTATION_TREE: a second copy of the snapshot, so the stages can run while exec plants
# mutants in the first (each command restores what it planted; two in one tree would see each other's).
TREE = Path(os.environ.get("KVOFFLOAD_MUTATION_TREE", WORK / "tree"))
PACKAGE = "reference/kvoffload/"


def copy_tree(target: Path, only: str = "") -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        # results/ travel too: the gate's baseline, and the files the main suite's tests read (the docs'
        # generated tables, asv and run results); this tool's own results do not
        wanted = not name.startswith("results/mutation/")
        if source.is_file() and wanted and name.startswith(only):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
