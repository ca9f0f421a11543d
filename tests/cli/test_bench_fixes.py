"""The main job shows every fix: ``kvoffload bench`` replays the reference with each fix flag
switched off in turn, and on the bundled workloads each one moves a figure of the bench table
(and so a bar of the report's ablation chart). Here on the -small workloads, with the bench's own
comparison (``bench_figures.moved_figures``, which generates docs/fixes.md's table from the
published bench): a flag that stops moving anything fails, naming itself."""

from __future__ import annotations

import functools

import pytest

from kvoffload.bench_figures import ablation_labels, moved_figures
from kvoffload.choice import ConnectorChoice
from kvoffload.cli.bench import BENCH_CONNECTORS, BENCH_WORKLOADS, TABLE_METRICS
from kvoffload.core.fixes import HIDDEN_BY, ablation
from kvoffload.core.fixes import FIX_NAMES, PRESETS
from kvoffload.runner import replay_workload
from kvoffload.workloads import load_workload


@functools.lru_cache(maxsize=None)
def metrics(workload: str, disabled: tuple[str, ...]) -> dict:
    return replay_workload(load_workload(workload), ConnectorChoice.build(disabled=disabled)).result["metrics"]


def test_the_bench_runs_the_reference_without_each_fix_flag():
    assert BENCH_CONNECTORS == ((None, ()), *((None, ablation(fix)) for fix in FIX_NAMES),
                                *((preset, ()) for preset in PRESETS))
    assert set(HIDDEN_BY) < set(FIX_NAMES) and set(HIDDEN_BY.values()) < set(FIX_NAMES)
    assert {"last_chunk_offloaded_rate", "poisoned_loads", "crashes", "stuck_requests"} <= set(TABLE_METRICS)


def test_the_reference_offloads_every_finished_requests_last_chunk():
    assert {name: metrics(name + "-small", ())["last_chunk_offloaded_rate"] for name in BENCH_WORKLOADS} == dict.fromkeys(
        BENCH_WORKLOADS, 1.0)


@pytest.mark.parametrize("fix", FIX_NAMES)
def test_each_fix_switched_off_moves_a_figure_of_the_bench(fix):
    """The first -small workload (in the bench's order) on which the run without ``fix`` prints
    another figure than the run it is compared with; the bug's own symptom where it has one."""
    off_label, before_label = ablation_labels(fix)
    disabled = ablation(fix)
    for workload in (name + "-small" for name in BENCH_WORKLOADS):
        summary = {"rows": [{"workload": workload, "connector": before_label, "metrics": metrics(workload, disabled[:-1])},
                            {"workload": workload, "connector": off_label, "metrics": metrics(workload, disabled)}]}
        moved = moved_figures(summary, fix)
        if moved:
            break
    else:
        pytest.fail(f"{fix} off moves no figure of the bench table on any -small workload")
    assert SYMPTOM[fix] in [name for name, _, _ in moved[workload]], (workload, moved)


# What each bug does, as the bench table shows it (the flag's FIX_INFO "reproduces"): the figure
# that must be among those that move. defer_lookup_while_transferring: a re-admitted request's
# lookup no longer waits for its own stores in flight, so it is admitted on what the tier holds
# then; vLLM's crash (assert not transfer_jobs) needs a tier that reads pending chunks as absent,
# which the gates plant (tests/gates/test_k06_k20_lifecycle.py, TestK10...).
SYMPTOM = {
    "last_block_at_finish": "last_chunk_offloaded_rate",
    "flush_submits_before_wait": "poisoned_loads",
    "deferred_finish_signal": "lifecycle_violations",
    "final_token_watermark": "poisoned_loads",
    "aborted_watermark": "poisoned_loads",
    "storable_within_allocated": "crashes",
    "defer_lookup_while_transferring": "offload_hit_rate",
    "reset_clears_request_jobs": "crashes",
}


def test_the_glance_table_marks_a_preset_the_bench_did_not_run():
    """README's "Results at a glance": a preset with no row in the bench summary (newer than the
    published bench) reads "-" and is named under the table, not "=" (never behind)."""
    from kvoffload.bench_figures import GLANCE, at_a_glance_markdown

    measured = {name: 1.0 if name.endswith("rate") else 0 for name in GLANCE}
    summary = {"rows": [{"workload": "w", "connector": label, "metrics": measured} for label in ("reference", "vllm-0.25")]}
    lines = at_a_glance_markdown(summary, "abcdef1234", "2026-12-07").splitlines()
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| `")}
    assert rows["| `vllm-0.25` (0.25.0)"].endswith("| = | = | = | = | = | = |")
    assert rows["| `vllm-0.26` (0.26.0)"].endswith("| - | - | - | - | - | - |")
    missing = " and ".join(f"`{name}`" for name in PRESETS if name != "vllm-0.25")
    assert f'"-": {missing} not in this bench.' in lines[-1]
