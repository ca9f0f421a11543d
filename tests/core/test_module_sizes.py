"""Small modules (docs/design.md): no Python file of the project, tests and scripts included, is
over 400 lines. A file that grows past it is split by what it owns, not cut at line 400."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def python_files() -> list[str]:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", "*.py"], capture_output=True,
                            text=True, check=True, timeout=60).stdout
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_no_python_file_is_over_400_lines():
    files = python_files()
    assert len(files) > 100  # the project's files were found, not an empty listing
    long = {name: count for name in files
            if (count := len((ROOT / name).read_text(errors="replace").splitlines())) > MAX_LINES}
    assert long == {}
