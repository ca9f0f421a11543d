"""Small rules of the command line's texts, each on a hand-made case: the bench table's columns
(names left, numbers right), the one-line summary of what differs between two runs, and the
description ``--help`` opens with."""

from __future__ import annotations

from kvoffload.cli import __doc__ as cli_doc
from kvoffload.cli.app import build_parser
from kvoffload.cli.bench import TABLE_METRICS, _bench_table
from kvoffload.cli.compare import _first_three


def test_the_bench_table_aligns_names_left_and_numbers_right():
    metrics = {name: 0.5 for name in TABLE_METRICS}
    lines = _bench_table([("multi-turn", "reference", metrics, False)]).splitlines()
    header, row = lines[0], lines[2]
    assert header.startswith("workload    connector") and row.startswith("multi-turn  reference")
    first_number = row.split()[2]
    third = header.split()[2]
    # the third column's value ends where its header ends: right-aligned
    assert row.index(first_number, len("multi-turn  reference")) + len(first_number) == header.index(third) + len(third)


def test_what_differs_is_three_items_and_a_count_of_the_rest():
    assert _first_three(["a", "b"]) == "a, b"
    assert _first_three(["a", "b", "c", "d", "e"]) == "a, b, c, and 2 more"


def test_help_opens_with_the_first_line_of_the_command_lines_description():
    assert build_parser().description == cli_doc.splitlines()[0] == "The ``kvoffload`` command line."
