"""docs/connectors.md's connector x release matrix is generated, never edited: it is what
scripts/connectors_table writes from the committed table (results/releases/connectors.json),
so a hand edit of a cell, or a table re-measured without regenerating the page, fails here."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "connectors_table"


def load_script():
    loader = importlib.machinery.SourceFileLoader("connectors_table", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("connectors_table", loader))
    loader.exec_module(module)
    return module


def test_the_page_holds_the_matrix_of_the_committed_table():
    script = load_script()
    table = json.loads((ROOT / "results" / "releases" / "connectors.json").read_text())
    assert script.documented_block() == script.generated_block(table)


def test_the_matrix_has_a_cell_per_connector_for_every_release_workload_and_scheduling():
    table = json.loads((ROOT / "results" / "releases" / "connectors.json").read_text())
    cells = {(r["release"], r["workload"], r["scheduling"], r["connector"]) for r in table["rows"]}
    assert len(cells) == len(table["rows"])  # one cell each, no duplicate measurement
    connectors = {key[3] for key in cells}
    assert {"stock", "simple-cpu", "simple-cpu-lazy"} <= connectors
    rows = {key[:3] for key in cells}
    assert len(cells) == len(rows) * len(connectors)
