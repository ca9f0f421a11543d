"""``kvoffload bench --engine vllm``'s table and ratios on hand-made rows (no vLLM needed): every
connector ran three interleaved rounds; measured columns show median (min-max), deterministic
columns one value, and the ratios against offload off are taken within each round."""

from __future__ import annotations

import re

from kvoffload.cli.bench_model import model_bench_table, ratio_lines


def rows():
    off = [{"output_tokens_per_s": v, "ttft_ms_p50": 200.0, "tpot_ms_p50": 40.0} for v in (50.0, 25.0, 40.0)]
    stock = [{"output_tokens_per_s": v, "ttft_ms_p50": 100.0, "tpot_ms_p50": 30.0, "output_mismatches": 0}
             for v in (100.0, 50.0, 100.0)]
    reference = [{"output_tokens_per_s": 125.0, "ttft_ms_p50": t, "tpot_ms_p50": 20.0, "output_mismatches": 0,
                  "store_submit_delay_steps_p50": 1, "store_submit_delay_steps_p99": 3} for t in (50.0, 60.0, 40.0)]
    return [("w", "off", off, False), ("w", "vllm-stock", stock, False), ("w", "reference", reference, False)]


def test_ratios_are_taken_within_each_round_and_shown_with_their_range():
    lines = ratio_lines(rows()).splitlines()
    # stock / off per round: 100/50, 50/25, 100/40 = 2.00, 2.00, 2.50; TTFT and TPOT the same every round
    assert lines[1].endswith("2.00x (2.00-2.50)  0.50x  0.75x")
    # reference / off: 125/50, 125/25, 125/40 = 2.50, 5.00, 3.125; TTFT 50/200, 60/200, 40/200
    assert lines[2].endswith("3.12x (2.50-5.00)  0.25x (0.20-0.30)  0.50x")


def table_cell(table: str, connector: str, header: str) -> str:
    """The cell under ``header`` in ``connector``'s row (columns are two or more spaces apart)."""
    lines = table.splitlines()
    row = next(line for line in lines[2:] if line.split()[1:2] == [connector])
    return dict(zip(re.split(r"\s{2,}", lines[0].strip()), re.split(r"\s{2,}", row.strip())))[header]


def test_measured_columns_are_marked_and_show_median_and_range():
    table = model_bench_table(rows(), {})
    header = re.split(r"\s{2,}", table.splitlines()[0].strip())
    assert {"out tok/s*", "ttft50*", "mismatch*"} <= set(header)  # measured: marked
    assert {"sub50", "sub99", "offload"} <= set(header)  # deterministic: not marked
    assert table_cell(table, "off", "out tok/s*") == "40.00 (25.00-50.00)"
    assert table_cell(table, "reference", "ttft50*") == "50.00 (40.00-60.00)"
    assert "median (min-max) of 3 interleaved runs" in table


def test_a_deterministic_column_that_differs_between_rounds_says_so():
    data = rows()
    data[2][2][1]["store_submit_delay_steps_p50"] = 2
    assert table_cell(model_bench_table(data, {}), "reference", "sub50") == "varies (1-2)"
    assert table_cell(model_bench_table(rows(), {}), "reference", "sub50") == "1"


def test_the_mismatch_column_shows_the_worst_rounds_identical_of_compared():
    oracles = {("w", "reference"): [{"identical": 32, "compared": 32}, {"identical": 31, "compared": 32}]}
    table = model_bench_table(rows(), oracles)
    assert table_cell(table, "reference", "mismatch*") == "31/32"
    assert table_cell(table, "vllm-stock", "mismatch*") == "0"


def test_offload_off_has_no_store_submission_delays():
    table = model_bench_table(rows(), {})
    assert (table_cell(table, "reference", "sub50"), table_cell(table, "reference", "sub99")) == ("1", "3")
    assert (table_cell(table, "off", "sub50"), table_cell(table, "off", "sub99")) == ("-", "-")


def test_names_are_aligned_left_and_numbers_right():
    lines = model_bench_table(rows(), {}).splitlines()
    header, off = lines[0], next(line for line in lines[2:] if line.split()[1:2] == ["off"])
    assert header.startswith("workload  connector") and off.startswith("w         off  ")
    cell = "40.00 (25.00-50.00)"  # under "out tok/s*", right-aligned: both end in one column
    assert off.index(cell) + len(cell) == header.index("out tok/s*") + len("out tok/s*")
