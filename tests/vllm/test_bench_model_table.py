"""``kvoffload bench --engine vllm``'s table and ratios on hand-made rows (no vLLM needed)."""

from __future__ import annotations

from kvoffload.cli.bench_model import model_bench_table, ratio_lines


def rows():
    off = {"output_tokens_per_s": 50.0, "ttft_ms_p50": 200.0, "tpot_ms_p50": 40.0}
    stock = {"output_tokens_per_s": 100.0, "ttft_ms_p50": 100.0, "tpot_ms_p50": 30.0, "output_mismatches": 0}
    reference = {"output_tokens_per_s": 125.0, "ttft_ms_p50": 50.0, "tpot_ms_p50": 20.0, "output_mismatches": 0,
                 "store_submit_delay_steps_p50": 1, "store_submit_delay_steps_p99": 3}
    return [("w", "off", off, False), ("w", "vllm-stock", stock, False), ("w", "reference", reference, False)]


def test_ratios_are_each_connector_over_offload_off_in_the_same_run():
    lines = ratio_lines(rows()).splitlines()
    # stock: 100 / 50 tok/s, 100 / 200 ms TTFT, 30 / 40 ms TPOT; reference: 125 / 50, 50 / 200, 20 / 40
    assert lines[1].split()[-3:] == ["2.00x", "0.50x", "0.75x"]
    assert lines[2].split()[-3:] == ["2.50x", "0.25x", "0.50x"]


def test_the_mismatch_column_shows_identical_of_compared():
    oracles = {("w", "reference"): {"identical": 31, "compared": 32}}
    table = model_bench_table(rows(), oracles)
    reference_row = next(line for line in table.splitlines() if line.startswith("w ") and "reference" in line)
    assert "31/32" in reference_row
    stock_row = next(line for line in table.splitlines() if "vllm-stock" in line)
    assert "31/32" not in stock_row


def test_the_store_submission_delays_have_their_columns_and_offload_off_has_none():
    lines = model_bench_table(rows(), {}).splitlines()
    reference_row = next(line for line in lines if line.startswith("w ") and "reference" in line)
    off_row = next(line for line in lines if line.startswith("w ") and " off " in line)

    def cell(row: str, header: str) -> str:  # right-aligned under its header
        end = lines[0].index(header) + len(header)
        return row[:end].split()[-1]

    assert (cell(reference_row, "sub50"), cell(reference_row, "sub99")) == ("1", "3")
    assert (cell(off_row, "sub50"), cell(off_row, "sub99")) == ("-", "-")
