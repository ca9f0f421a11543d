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
    import os

    from fault_trials import TRIALS, table
    from fuzz_inputs import INPUTS

    if INPUTS:
        counts = ", ".join(f"{category} {count}" for category, count in sorted(INPUTS.items()))
        terminalreporter.write_line(f"CLI fuzz: {sum(INPUTS.values())} inputs ({counts})")
    real = [trial for trial in TRIALS if trial.command != "planted"]
    if real:
        text = f"fault trials (seeds {min(t.seed for t in real)}-{max(t.seed for t in real)}, load " \
               f"{os.getloadavg()[0]:.1f}):\n{table(real)}"
        terminalreporter.write_line(text)
        if os.environ.get("KVOFFLOAD_FAULT_TABLE"):
            Path(os.environ["KVOFFLOAD_FAULT_TABLE"]).write_text(text + "\n")
