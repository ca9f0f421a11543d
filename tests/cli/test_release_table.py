"""The release table's provenance on hand-made tables: one commit only when every row has it."""

from __future__ import annotations

from kvoffload.cli.releases import provenance


def test_a_table_without_rows_names_no_commit():
    assert provenance([]) == {"commit": None, "commits": {}}
    assert provenance([{"rows": []}]) == {"commit": None, "commits": {}}


def test_one_commit_is_named_only_when_every_row_has_it():
    assert provenance([{"rows": [{"commit": "abc"}, {"commit": "abc"}]}]) == {"commit": "abc", "commits": {"abc": 2}}
    assert provenance([{"rows": [{"commit": "abc"}, {}]}])["commit"] is None
