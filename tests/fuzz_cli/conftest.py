"""The fuzz harness of the command line and the loaders (issue 15).

Every generated input must end in exit 0, exit 1 with a recorded crash, or exit 2 with one line:
never a traceback, a signal, or a run past the time bound. The strategies and the settings live in
``fuzz_inputs.py`` beside this file; this conftest puts the folder on ``sys.path`` for it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_terminal_summary(terminalreporter):
    from fuzz_inputs import INPUTS

    if INPUTS:
        counts = ", ".join(f"{category} {count}" for category, count in sorted(INPUTS.items()))
        terminalreporter.write_line(f"CLI fuzz: {sum(INPUTS.values())} inputs ({counts})")
