"""Where ``kvoffload bench`` writes: its default folder per engine, and a vLLM engine's bench's
folder per engine inside it (``kvoffload report`` draws one engine's runs of a workload on an
axis, never two). Shared by ``bench.py`` and ``bench_model.py``."""

from __future__ import annotations

from pathlib import Path

from kvoffload.cli.outputs import DEFAULT_ROOT
from kvoffload.engines import SIMULATOR

# bench-summary*.json, written by bench.py (the simulator's) and bench_model.py (the vllm engine's)
SUMMARY_SCHEMA = "kvoffload-bench/bench/v1"


def default_out_dir(engine: str) -> Path:
    """Where bench writes without --out-dir: the simulator's runs in out/runs/, a vLLM engine's
    bench (which replays on the simulator too) in out/runs-ENGINE/, never mixed with them."""
    return DEFAULT_ROOT / ("runs" if engine == SIMULATOR else f"runs-{engine}")


def engine_folder(out_dir: Path, engine: str) -> Path:
    """A vLLM engine's bench keeps each engine's runs in a folder of their own under ``out_dir``:
    ``kvoffload report`` puts one engine's runs of a workload on an axis, never two."""
    return out_dir / engine


def report_hint(out_dir: Path, engine: str) -> str:
    """The report command for a vLLM engine's bench: its folder holds two engines' runs."""
    return (f"charts: kvoffload report --from {engine_folder(out_dir, engine)} --out {out_dir / 'charts'} "
            f"(the simulator's runs: --from {engine_folder(out_dir, SIMULATOR)})")
