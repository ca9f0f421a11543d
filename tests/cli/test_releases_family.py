"""``kvoffload releases --connector``: the connector x release matrix from the rows each
release's venv prints (``kvoffload.vllm.rows --connector``), on hand-made rows (no vLLM)."""

from __future__ import annotations

from kvoffload.cli.releases_family import cell, matrix_markdown, merged, summary


def row(release="0.32.0", workload="multi-turn-small", **metrics):
    base = {"last_block_hit_rate": 1.0, "offload_hit_rate": 0.5, "poisoned_loads": 0, "crashes": 0,
            "lifecycle_violations": None, "leaked_requests": 0, "stuck_requests": 0, "fence_violations": None,
            "store_submit_delay_steps_p50": 1, "store_submit_delay_steps_p99": 3}
    return {"release": release, "workload": workload, "scheduling": "sync", "metrics": {**base, **metrics},
            "error": None, "leaked": [], "stuck": []}


def test_a_cell_keeps_the_rates_and_names_what_went_wrong():
    clean = cell(row(), "simple-cpu", "abc", 1.234)
    assert summary(clean) == "last-blk 1.000, offload 0.500, submit 1/3; clean"
    poisoned = cell(row(poisoned_loads=2, leaked_requests=1), "stock", "abc", 1.0)
    assert summary(poisoned).endswith("; poisoned 2, leaked 1")
    failed = cell({"release": "0.25.0", "workload": "w", "scheduling": "sync", "setup_error": "ConfigError: x"},
                  "simple-cpu", None, 0.5)
    assert summary(failed) == "setup failed: ConfigError: x"


def test_a_run_replaces_its_cells_and_keeps_the_others():
    before = [cell(row(release="0.31.0"), "stock", "old", 1), cell(row(), "stock", "old", 1)]
    fresh = [cell(row(offload_hit_rate=0.25), "stock", "new", 1)]
    table = merged(before, fresh)
    assert [(e["release"], e["commit"]) for e in table] == [("0.31.0", "old"), ("0.32.0", "new")]


def test_the_markdown_has_releases_down_and_connectors_across():
    rows = [cell(row(last_block_hit_rate=0.5), "simple-cpu", "c", 1), cell(row(), "stock", "c", 1)]
    lines = matrix_markdown(rows).splitlines()
    assert lines[0] == "| release | workload | sched | stock | simple-cpu |"
    assert lines[2].startswith("| 0.32.0 | multi-turn-small | sync | last-blk 1.000") and "last-blk 0.500" in lines[2]


def test_the_earlier_matrix_is_read_back_and_anything_else_in_its_place_is_no_rows(tmp_path):
    """A run keeps the cells an earlier run wrote to --out; a missing file, text that is not
    JSON, a table of another kind or a JSON list there gives no earlier cells (and no traceback)."""
    import json

    from kvoffload.cli.releases_family import SCHEMA, earlier

    out = tmp_path / "matrix.json"
    cells = [cell(row(), "stock", "abc", 1.0)]
    assert earlier(out) == []
    out.write_text(json.dumps({"schema": SCHEMA, "rows": cells}))
    assert earlier(out) == cells
    for text in ("{", json.dumps({"schema": "kvoffload-bench/releases/v1", "rows": cells}), json.dumps(cells)):
        out.write_text(text)
        assert earlier(out) == []
