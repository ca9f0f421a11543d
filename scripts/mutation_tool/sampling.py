"""The deterministic sample: which mutants run (one per source site outside annotations, the sites
of lowest hash first), and the rest marked skipped in their sessions."""

from __future__ import annotations

import ast
import functools
import hashlib
import sqlite3

from places import PACKAGE, TREE, WORK
from sessions import key, session_name
from targets import TESTS_OF


def rank(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def annotation_spans(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of every annotation in a module. Every mutated module starts with ``from
    __future__ import annotations`` (PEP 563): an annotation is never evaluated, so a mutant
    inside one is equivalent by construction and is left out of the sample. A module without it
    evaluates its annotations: none is left out."""
    source = (TREE / PACKAGE / module).read_text()
    tree = ast.parse(source)
    if not any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(alias.name == "annotations" for alias in node.names) for node in tree.body):
        return []  # annotations are evaluated there (a package's __init__.py): their mutants count
    spans = []
    for node in ast.walk(tree):
        notes = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            notes.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            notes.append(node.returns)
        if isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes]
    return spans


def in_annotation(row: dict, spans) -> bool:
    return any(start <= row["start"] and row["end"] <= end for start, end in spans)


def sample(rows: list[dict], size: int) -> set[str]:
    """Deterministic: one mutant per source site outside annotations (the site's lowest-hash
    operator), then the ``size`` sites of lowest hash over all modules. A hash of names and
    positions, not a seeded RNG: the same tree always yields the same sample, and a module's
    share follows its size."""
    spans = {module: annotation_spans(module) for module in TESTS_OF}
    per_site: dict[tuple, dict] = {}
    for row in rows:
        if in_annotation(row, spans[row["module"]]):
            continue
        site = (row["module"], row["start"], row["end"])
        if site not in per_site or rank(key(row)) < rank(key(per_site[site])):
            per_site[site] = row
    chosen = sorted(per_site.values(), key=lambda row: rank(f"{row['module']}:{row['start']}:{row['end']}"))
    return {row["job"] for row in chosen[:size]}


def mark_sample(rows: list[dict], size: int) -> set[str]:
    """Mark every mutant outside the sample skipped. A resample keeps the verdicts of mutants
    already run: the sample of size n is the first n of one fixed order, so a run can grow in
    rounds (n = 100, 200, 330) and each round is a prefix of the next."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult
    chosen = sample(rows, size)
    for module in TESTS_OF:
        database = WORK / f"{session_name(module)}.sqlite"
        with sqlite3.connect(database) as connection:
            connection.execute("DELETE FROM work_results WHERE worker_outcome IN ('SKIPPED', 'skipped')")
        with use_db(str(database), WorkDB.Mode.open) as db:
            skipped = [row["job"] for row in rows if row["module"] == module and row["job"] not in chosen
                       and (row["result"] is None or row["result"]["worker_outcome"] == "skipped")]
            db.set_multiple_results(skipped, WorkResult(output="not in the sample",
                                                        worker_outcome=WorkerOutcome.SKIPPED))
    return chosen
