"""What the sessions hold: one cosmic-ray session database per module (its mutants and their
results, read directly), and the later stages' verdicts (``.mutation/stages.json``)."""

from __future__ import annotations

import contextlib
import json
import sqlite3

from places import WORK
from targets import TESTS_OF

# The rest of CI, in its order (.ci/run: the main suite, the regression gate, the vLLM stage and
# the packaged gates against stock and the reference); then "new": the module's selected tests
# again, with the tests written for the survivors (--refresh-tests), which is how a survivor is
# killed by a new test.
STAGES = ("main", "gate", "vllm", "packaged", "new")


def session_name(module: str) -> str:
    return module.replace("/", ".").removesuffix(".py")


def items(module: str) -> list[dict]:
    """Every work item of a module's session, with its result when it has one: read from the
    session database directly (what ``cosmic-ray dump`` prints, without its start-up per module)."""
    with contextlib.closing(sqlite3.connect(WORK / f"{session_name(module)}.sqlite")) as connection:
        found = connection.execute(
            "SELECT s.job_id, s.operator_name, s.occurrence, s.start_pos_row, s.start_pos_col, s.end_pos_row, "
            "s.end_pos_col, r.worker_outcome, r.output, r.test_outcome, r.diff FROM mutation_specs s "
            "LEFT JOIN work_results r ON r.job_id = s.job_id ORDER BY s.job_id").fetchall()
    rows = []
    for job, operator, occurrence, row0, col0, row1, col1, worker, output, test, diff in found:
        result = None if worker is None else {"worker_outcome": worker.lower(), "output": output,
                                              "test_outcome": test.lower() if test else None, "diff": diff}
        rows.append({"job": job, "module": module, "operator": operator, "occurrence": occurrence,
                     "start": (row0, col0), "end": (row1, col1), "result": result})
    return rows


def key(row: dict) -> str:
    return f"{row['module']}:{row['operator']}:{row['occurrence']}"


def verdicts() -> dict[str, dict]:
    path = WORK / "stages.json"
    return json.loads(path.read_text()) if path.exists() else {}


def survivors_after(stage: str) -> list[dict]:
    """The tool's survivors that no other stage killed."""
    done = verdicts()
    others = [s for s in STAGES if s != stage]
    alive = []
    for module in TESTS_OF:
        for row in items(module):
            if (row["result"] or {}).get("test_outcome") == "survived" and not any(
                    done.get(key(row), {}).get(s) == "killed" for s in others):
                alive.append(row)
    return alive
