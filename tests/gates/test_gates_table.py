"""scripts/gates_table --matrix DIR -k EXPR reruns some gates and keeps every other cell of the
README's matrix. A release venv set up since the last run adds a column: the kept cells must
follow their column's label, not its position (they were all wiped once, when 0.25.1 and 0.27.0
joined)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gates_table"


def load_script():
    loader = importlib.machinery.SourceFileLoader("gates_table", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gates_table", loader))
    loader.exec_module(module)
    return module


MATRIX = """
| gate (bug) | reference | vLLM 0.25.0 stock | vLLM 0.26.0 stock |
|---|---|---|---|
| `TestK03LastBlockAtFinish::test_the_next_turn_finds_chunk_1` (K03: last block never offloaded) | pass | **fail** (K03) | skipped: why not |
| `TestK07AbortOfAQueuedRequest::test_abort_of_a_queued_request` (K07: abort of a queued request) | pass | pass | **fail** (K07) |
"""


def test_each_kept_cell_is_found_by_its_columns_label():
    cells = load_script().previous_cells(MATRIX)
    k03, k07 = ("TestK03LastBlockAtFinish::test_the_next_turn_finds_chunk_1",
                "TestK07AbortOfAQueuedRequest::test_abort_of_a_queued_request")
    assert cells[k03] == {"reference": "pass", "vLLM 0.25.0 stock": "fail", "vLLM 0.26.0 stock": "skipped: why not"}
    assert cells[k07]["vLLM 0.26.0 stock"] == "fail"
    # a column the README does not have yet (0.25.1, between these two) has no cell to keep
    assert "vLLM 0.25.1 stock" not in cells[k07]


def test_every_row_of_the_readmes_own_matrix_is_read_back_under_every_column():
    script = load_script()
    text = script.matrix_text()
    header = next(line for line in text.splitlines() if line.startswith("| gate (bug) |"))
    gate_rows = [line for line in text.splitlines() if line.startswith("| `Test")]
    cells = script.previous_cells(text)
    assert len(cells) == len(gate_rows) > 0  # a row with a cell too many or too few is not kept
    assert all(list(row) == header.strip("| ").split(" | ")[1:] for row in cells.values())


def test_a_planted_connectors_row_is_kept_by_its_label(monkeypatch):
    """A rerun of some columns keeps the plant rows it did not run: a fix flag's row and a planted
    connector's row, whose label has spaces and a colon (it was once read as no row at all, and
    the K13 plant's failing gate was dropped)."""
    script = load_script()
    plants = """
| reference with the fix flag off (`--kv-disable`), or a planted connector | vLLM gates that fail |
|---|---|
| `reset_clears_request_jobs` | TestK20ResetForgetsRequestJobs::test_r1_is_readmitted_after_the_reset |
| `K13: allocations not fenced (UnfencedAllocationsConnector)` | TestK13MultiConnectorFence::test_a_block_another_connector_loads_into_is_fenced |
| `storable_within_allocated` | none: no vLLM gate plants this flag |
"""
    monkeypatch.setattr(script, "matrix_text", lambda: MATRIX + plants)
    assert script.previous_plants() == {
        "reset_clears_request_jobs": ["TestK20ResetForgetsRequestJobs::test_r1_is_readmitted_after_the_reset"],
        "K13: allocations not fenced (UnfencedAllocationsConnector)": [
            "TestK13MultiConnectorFence::test_a_block_another_connector_loads_into_is_fenced"],
        "storable_within_allocated": []}
