"""Facts with one owner: the presets, the fix descriptions and the metric glossary.

The code owns each list; everything else that shows it (README tables, the CLI, the asv suite)
is generated from it or checked against it here.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.core.fixes import FIX_INFO, FIX_NAMES, PRESETS, Fixes, ReleaseRules
from kvoffload.metrics import GLOSSARY, METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]


def test_every_fix_flag_is_described_once_and_in_order():
    flags = [f.name for f in dataclasses.fields(Fixes) if f.type in ("bool", bool)]
    assert flags == list(FIX_NAMES)
    assert len(set(FIX_NAMES)) == len(FIX_NAMES)
    assert all(info.rule and info.reproduces and info.first_release for info in FIX_INFO)


def test_presets_name_known_flags_in_release_order():
    releases = [tuple(int(part) for part in p.release.split(".")) for p in PRESETS.values()]
    assert releases == sorted(releases)
    for preset in PRESETS.values():
        assert set(preset.missing) <= set(FIX_NAMES)
        assert Fixes.preset(preset.name).disabled() == tuple(n for n in FIX_NAMES if n in preset.missing)
        assert Fixes.preset(preset.name).rules == preset.rules
    assert Fixes().rules == ReleaseRules()


def test_the_cli_and_the_asv_suite_take_the_one_preset_list():
    from kvoffload.cli import bench as cli

    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import bench_workloads  # a package: asv imports it as one (relative imports)
    finally:
        sys.path.remove(str(ROOT))
    assert [preset for preset, disabled in cli.BENCH_CONNECTORS if preset] == list(PRESETS)
    assert bench_workloads.CONNECTORS == ["reference", *PRESETS]
    # and the bundled workloads without scripted resets (kvoffload.workloads.bundled), written out there
    from kvoffload.workloads.bundled import DENSE_WORKLOADS, HYBRID_WORKLOADS

    assert bench_workloads.WORKLOADS == DENSE_WORKLOADS + HYBRID_WORKLOADS


def test_the_glossary_is_one_table_of_unique_names():
    from kvoffload.metrics import MEASURED_METRICS, MODEL_METRICS

    assert len(set(METRIC_NAMES)) == len(METRIC_NAMES) == len(GLOSSARY)
    assert MEASURED_METRICS - MODEL_METRICS == {"connector_us_per_step", "copy_gb_per_s", "sim_requests_per_s"}
    # A real model's (--engine vllm): every one of them is measured
    assert MODEL_METRICS == {"output_tokens_per_s", "total_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
                             "tpot_ms_p99", "prefill_tokens_computed", "prefill_tokens_saved", "output_mismatches",
                             "wall_seconds", "engine_start_seconds"} <= MEASURED_METRICS
    assert all(metric.definition for metric in GLOSSARY)
    assert {metric.better for metric in GLOSSARY} <= {"higher", "lower", "zero", "info"}


def _readme_tables():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import readme_tables
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return readme_tables


@pytest.mark.parametrize("table", ["at-a-glance", "fix-flags", "fix-moves", "metrics", "releases", "releases-full",
                                   "releases-hybrid"])
def test_the_readme_tables_are_what_the_code_generates(table):
    """Each generated table of the README and the docs pages equals what its owner generates now
    (the code's lists, the committed bench summary and release table)."""
    readme_tables = _readme_tables()
    page = readme_tables.TABLES[table][0]
    assert table not in readme_tables.stale_tables(readme_tables.read_pages()), (
        f"{page}'s {table} table differs from what generates it: run python scripts/readme_tables.py")


def test_the_readme_check_names_a_stale_table():
    script = ROOT / "scripts" / "readme_tables.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    readme_tables = _readme_tables()
    pages = readme_tables.read_pages()
    pages["docs/metrics.md"] = pages["docs/metrics.md"].replace("| `crashes` | zero |", "| `crashes` | low |")
    assert readme_tables.stale_tables(pages) == ["metrics"]
