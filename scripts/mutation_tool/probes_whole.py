"""Probes for the equivalent mutants of the run over the rest of the package (``fates_whole.py``):
each shows that no input the guarded code can see tells the mutant from the original."""

from __future__ import annotations

import inspect


def rounds_count_from_zero() -> None:
    """cli/bench_model.py run_model_bench: ``round_index == 0`` made ``<= 0``. The index comes from
    ``range(rounds)`` (the source is checked), so it is never negative, and on 0 .. rounds the two
    comparisons agree."""
    from kvoffload.cli import bench_model

    source = inspect.getsource(bench_model.run_model_bench)
    assert "for r in range(rounds)" in source and "(r, i)" in source
    assert source.count("round_index") == 2  # bound once from the order, read once
    for index in range(bench_model.ROUNDS + 100):
        assert (index == 0) == (index <= 0)


PROBES_WHOLE = [rounds_count_from_zero]
