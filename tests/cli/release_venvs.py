"""A stand-in for a release venv of ``scripts/setup-vllm``: the tests of ``kvoffload releases``
run it in place of vLLM (tests/cli is on ``sys.path``: conftest.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kvoffload.releases import venv_name


def stand_in_venv(folder: Path, code: str, release: str = "0.29.0") -> Path:
    """A venv of ``release`` under ``folder`` whose python runs ``code`` (argv: the jobs)."""
    bin_dir = folder / venv_name(release) / "bin"
    bin_dir.mkdir(parents=True)
    (folder / "stand_in.py").write_text(code)
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec {sys.executable} {folder / 'stand_in.py'} \"$@\"\n")
    os.chmod(bin_dir / "python", 0o755)
    return bin_dir / "python"
