"""The whole package (issue 29): every module of ``kvoffload`` outside the first run's (``targets.py``),
and which tests run against each of its mutants.

A selection is the test files that exercise the module, sharpest and fastest first, ``-x``; the
rest of CI runs against the survivors (``stage``). Modules under ``vllm/`` and ``gates/`` (the
packaged gates run vLLM's scheduler) are tested in the vLLM venv (``VLLM_MODULES``: their
selection is tests/vllm files, run by that venv's pytest without the fork server). Files of one
line or two without code to mutate (``kvoffload/__init__.py``'s version, ``cli/__main__.py``, the
empty ``core/`` and ``engine/`` ``__init__.py``) are left out.
"""

from __future__ import annotations

_CLI = ("tests/cli/test_cli.py", "tests/cli/test_help.py")
_HOSTILE = ("tests/cli/test_hostile_input.py",)
_REPORT = ("tests/report/test_report.py", "tests/report/test_report_outputs.py")
_HISTORY = ("tests/report/test_newest_commit.py", "tests/report/test_history_chart.py")
_WORKLOADS = ("tests/workloads",)
_WORKER = ("tests/worker",)
_GATE = ("tests/gate/test_gate.py", "tests/gate/test_gate_verdicts.py", "tests/gate/test_gate_counts.py")
_VLLM_CORE = ("tests/vllm/test_compat.py", "tests/vllm/test_connector_in_vllm.py", "tests/vllm/test_kv_delivery.py")
_GATES_PLUGIN = ("tests/vllm/test_gates_plugin.py", "tests/vllm/test_gate_story.py", "tests/vllm/test_preset_gates.py")
_HYBRID_CORE = ("tests/core/test_hybrid_connector.py", "tests/core/test_mamba_connector.py")
_MAMBA_ENGINE = ("tests/engine/test_mamba_rules.py", "tests/engine/test_mamba_speculative.py", "tests/engine/test_mamba_states.py")
_STANDINS = ("tests/vllm/test_simple_cpu.py", "tests/worker/test_standins.py")
_MODEL = ("tests/vllm/test_engine_geometry.py", "tests/vllm/test_engine_settings.py", "tests/vllm/test_output_oracle.py")

WHOLE_TESTS_OF: dict[str, tuple[str, ...]] = {
    "choice.py": ("tests/cli/test_bench_fixes.py",) + _CLI,
    "cli/__init__.py": _CLI + ("tests/cli/test_interrupt.py",),
    "cli/app.py": _CLI + ("tests/cli/test_outputs_default.py",) + _HOSTILE,
    "cli/bench.py": ("tests/cli/test_bench_fixes.py", "tests/cli/test_bench_vllm_folders.py") + _CLI,
    "cli/bench_folders.py": ("tests/cli/test_bench_vllm_folders.py",),
    "cli/bench_model.py": ("tests/vllm/test_bench_model_table.py", "tests/cli/test_bench_vllm_folders.py"),
    "cli/compare.py": ("tests/cli/test_compare.py",),
    "cli/flags.py": _CLI + _HOSTILE,
    "cli/gate.py": _GATE,
    "cli/info.py": _CLI,
    "cli/outputs.py": ("tests/cli/test_outputs_default.py", "tests/cli/test_output_folders.py") + _HOSTILE,
    "cli/releases.py": ("tests/cli/test_releases.py",),
    "cli/run.py": _CLI + ("tests/cli/test_stuck_run.py",) + _HOSTILE,
    "cli/sweep.py": ("tests/sweep/test_sweep.py",) + _HOSTILE,
    "counts.py": ("tests/gate/test_gate_counts.py", "tests/benchmarks/test_bench_counts.py"),
    "engines.py": ("tests/cli/test_bench_vllm_folders.py",) + _CLI,
    "gate_baseline.py": _GATE,
    "gate_counts.py": ("tests/gate/test_gate_counts.py",),
    "gate_signatures.py": ("tests/gate/test_gate_verdicts.py",),
    "long_numbers.py": ("tests/report/test_sources.py",) + _HOSTILE,
    "releases.py": ("tests/cli/test_releases.py", "tests/report/test_releases_chart.py"),
    "report/__init__.py": ("tests/report/test_report_outputs.py", "tests/report/test_report.py"),
    "report/ablation.py": ("tests/report/test_ablation_chart.py",) + _REPORT,
    "report/changes.py": _HISTORY,
    "report/delays.py": _REPORT + ("tests/report/test_figure_sizes.py",),
    "report/figures.py": _REPORT + ("tests/report/test_figure_sizes.py",),
    "report/history.py": _HISTORY + ("tests/benchmarks/test_machine_identity.py",),
    "report/history_marks.py": _HISTORY,
    "report/history_text.py": _HISTORY,
    "report/kinds.py": _HISTORY,
    "report/moves.py": _HISTORY,
    "report/page.py": ("tests/report/test_newest_commit.py",) + _REPORT,
    "report/releases.py": ("tests/report/test_releases_chart.py",),
    "report/scaling.py": ("tests/perf/test_scaling_chart.py",),
    "report/sources.py": ("tests/report/test_sources.py",) + _HISTORY + _REPORT,
    "results.py": ("tests/report/test_sources.py", "tests/cli/test_compare.py") + _CLI,
    "runner.py": ("tests/engine/test_invariant_results.py",) + _CLI,
    "sweep.py": ("tests/sweep/test_sweep.py",),
    "sweep_workers.py": ("tests/sweep/test_sweep_processes.py", "tests/sweep/test_sweep.py"),
    "tables.py": ("tests/cli/test_compare.py",) + _GATE,
    "worker/__init__.py": _WORKER,
    "worker/cuda.py": _WORKER,
    "worker/handler.py": _WORKER,
    "worker/kv.py": _WORKER + ("tests/engine/test_oracle.py",),
    "worker/stepped.py": _WORKER,
    "worker/threaded.py": _WORKER,
    "workloads/__init__.py": _WORKLOADS,
    "workloads/definition.py": _WORKLOADS,
    "workloads/distributions.py": _WORKLOADS,
    "workloads/limits.py": _WORKLOADS + ("tests/perf/test_sizing.py",),
    "workloads/mooncake.py": ("tests/workloads/test_traces.py", "tests/perf/test_streamed_trace.py",
                              "tests/perf/test_sizing.py"),
    "workloads/multi_turn.py": _WORKLOADS,
    "workloads/registry.py": _WORKLOADS,
    "workloads/schema.py": _WORKLOADS,
    "workloads/shared_prefix.py": _WORKLOADS,
    "workloads/sharegpt.py": ("tests/workloads/test_traces.py",) + _WORKLOADS,
    "workloads/sizing.py": ("tests/perf/test_sizing.py",) + _WORKLOADS,
    "workloads/spec_decode.py": _WORKLOADS,
    "workloads/stream.py": ("tests/perf/test_streamed_trace.py",) + _WORKLOADS,
    "workloads/summary.py": _WORKLOADS,
    "workloads/tokens.py": ("tests/workloads/test_traces.py", "tests/perf/test_streamed_trace.py") + _WORKLOADS,
    # modules new since the 274dc7d sample (the next one takes them; core/ and engine/ files the
    # first run never listed are here, beside the rest of the package)
    "bench_figures.py": ("tests/cli/test_bench_fixes.py",) + _CLI,
    "cli/findings.py": ("tests/cli/test_bench_fixes.py",) + _CLI,
    "cli/releases_family.py": ("tests/cli/test_releases_family.py", "tests/cli/test_releases_step_timeout.py"),
    "cli/stderr_hold.py": ("tests/cli/test_releases_hardened.py",) + _HOSTILE,
    "core/drafter.py": ("tests/core/test_drafter_groups.py", "tests/gates/test_k14_k19_hybrid.py",
                        "tests/gates/test_k17_drafter_group.py"),
    "core/hybrid.py": _HYBRID_CORE + ("tests/engine/test_kv_groups.py", "tests/gates/test_k14_k19_hybrid.py"),
    "core/hybrid_stores.py": _HYBRID_CORE + ("tests/gates/test_k14_k19_hybrid.py",),
    "core/keys.py": _HYBRID_CORE + _MAMBA_ENGINE,
    "core/model.py": ("tests/engine/test_kv_groups.py",) + _MAMBA_ENGINE + _HYBRID_CORE,
    "engine/block_grids.py": ("tests/engine/test_block_grids.py", "tests/gates/test_k15_k16_block_sizes.py"),
    "engine/bounded.py": ("tests/engine/test_bounded.py", "tests/cli/test_bench_step_timeout.py"),
    "engine/drafter.py": ("tests/engine/test_drafter.py", "tests/gates/test_k14_k19_hybrid.py"),
    "engine/drafter_kv.py": ("tests/engine/test_drafter_group.py", "tests/gates/test_k17_drafter_group.py"),
    "engine/forward_writes.py": ("tests/engine/test_oracle.py", "tests/gates/test_k14_k19_hybrid.py"),
    "engine/crashes.py": ("tests/engine/test_crash_verdicts.py", "tests/engine/test_child_processes.py"),
    "engine/kv_groups.py": ("tests/engine/test_kv_groups.py", "tests/engine/test_block_grids.py") + _MAMBA_ENGINE,
    "engine/mamba.py": _MAMBA_ENGINE + ("tests/engine/test_kv_groups.py",),
    "engine/step.py": ("tests/engine/test_engine_replays.py", "tests/engine/test_vllm_rules.py"),
    "interrupts.py": ("tests/cli/test_interrupt.py",),
    "release_io.py": ("tests/cli/test_releases_hardened.py", "tests/cli/test_releases.py"),
    "workloads/bundled.py": ("tests/workloads/test_bundled.py", "tests/core/test_facts.py"),
    # the vLLM venv
    "gates/test_k13_composed.py": ("tests/vllm/test_gates_planted.py",) + _GATES_PLUGIN,
    "gates/test_k14_k19_hybrid.py": ("tests/vllm/test_gates_planted.py", "tests/vllm/test_mamba.py",
                                     "tests/vllm/test_k17_drafter_groups.py", "tests/vllm/test_k19_divergent_hits.py"),
    "gates/test_k15_k16_block_sizes.py": ("tests/vllm/test_k15_k16_block_sizes.py",),
    "vllm/compat/v0_27.py": ("tests/vllm/test_compat.py",),
    # CI runs its refusals and each control's one changed answer (tests/vllm/control_probe.py)
    "vllm/controls.py": ("tests/vllm/test_controls.py",),
    "vllm/drafter_group.py": ("tests/vllm/test_drafter_group.py",),
    "vllm/fake_worker.py": ("tests/vllm/test_mamba.py",) + _VLLM_CORE,
    "vllm/foreign.py": ("tests/vllm/test_foreign_connectors.py", "tests/vllm/test_foreign_failures.py"),
    "vllm/group_blocks.py": ("tests/vllm/test_k15_k16_block_sizes.py",),
    "vllm/peer.py": ("tests/vllm/test_gates_planted.py",) + _GATES_PLUGIN,
    "vllm/standins/__init__.py": _STANDINS,
    "vllm/standins/dma.py": _STANDINS,
    "vllm/standins/streams.py": _STANDINS,
    "vllm/standins/threads.py": _STANDINS,
    "vllm/standins/timeline.py": _STANDINS,
    "vllm/tiny_kv.py": ("tests/vllm/test_mamba.py",) + _VLLM_CORE,
    "gates/__init__.py": _GATES_PLUGIN,
    "gates/catalogue.py": ("tests/gates/test_catalogue.py",) + _GATES_PLUGIN,
    "gates/plugin.py": _GATES_PLUGIN,
    "gates/story.py": _GATES_PLUGIN,
    "gates/test_k01_k05_finish.py": _GATES_PLUGIN,
    "gates/test_k06_k20_lifecycle.py": _GATES_PLUGIN,
    "gates/test_k21_k30_tier.py": _GATES_PLUGIN,
    "vllm/__init__.py": _VLLM_CORE,
    "vllm/adapters.py": _VLLM_CORE,
    "vllm/build.py": _VLLM_CORE + ("tests/vllm/test_stock_and_broken.py",),
    "vllm/compat/__init__.py": ("tests/vllm/test_compat.py",),
    "vllm/compat/v0_26.py": ("tests/vllm/test_compat.py",),
    "vllm/compat/v0_29.py": ("tests/vllm/test_compat.py",),
    "vllm/compat/v0_30.py": ("tests/vllm/test_compat.py",),
    "vllm/connector.py": ("tests/vllm/test_connector_in_vllm.py", "tests/vllm/test_cli_vllm.py"),
    "vllm/connector_parts.py": ("tests/vllm/test_connector_in_vllm.py",),
    "vllm/engine.py": ("tests/vllm/test_cli_vllm.py", "tests/vllm/test_store_delays.py"),
    "vllm/geometry.py": ("tests/vllm/test_engine_geometry.py",),
    # the --engine vllm path runs only in CI's real-model replay (without it a syntax error in
    # run_on_model's signature survived the selection: none of _MODEL imports llm_engine.py)
    "vllm/llm_engine.py": _MODEL + ("tests/vllm/test_real_model.py",),
    "vllm/llm_start.py": _MODEL + ("tests/vllm/test_real_model.py",),
    "vllm/model.py": ("tests/vllm/test_compat.py",) + _MODEL,
    "vllm/observe.py": ("tests/vllm/test_store_delays.py",) + _VLLM_CORE,
    "vllm/outputs.py": ("tests/vllm/test_output_oracle.py",),
    "vllm/pinned.py": ("tests/vllm/test_differential.py",),
    "vllm/regions.py": ("tests/vllm/test_compat.py",) + _VLLM_CORE,
    "vllm/replay.py": _VLLM_CORE + ("tests/vllm/test_stock_and_broken.py",),
    "vllm/rows.py": ("tests/cli/test_subprocess_options.py",),
    "vllm/scheduled_writes.py": _VLLM_CORE + ("tests/vllm/test_store_delays.py",),
    "vllm/settings.py": ("tests/vllm/test_settings_table.py", "tests/vllm/test_engine_settings.py"),
    "vllm/stock.py": ("tests/vllm/test_stock_and_broken.py",),
    "vllm/weights.py": ("tests/vllm/test_engine_geometry.py",),
}
# The files of the tests written for the survivors of the sample at 01948bc (fates_whole.py), and of
# the CI tests that killed one outside its module's selection: each joins that selection, so the
# next exec runs them.
_KILLED_SURVIVORS_OF_01948BC = {
    "bench_figures.py": ("tests/core/test_facts.py",),
    "cli/bench.py": ("tests/cli/test_bench_refused.py",),
    "cli/bench_model.py": ("tests/cli/test_bench_model_rounds.py",),
    "cli/compare.py": ("tests/cli/test_table_rules.py",),
    "cli/releases.py": ("tests/cli/test_releases_hardened.py",),
    "cli/sweep.py": ("tests/cli/test_flag_rules.py",),
    "core/model.py": ("tests/gates/test_k15_k16_block_sizes.py",),
    "gates/story.py": ("tests/vllm/test_story_helpers.py",),
    "gates/test_k01_k05_finish.py": ("tests/vllm/test_gates_flag_plants.py",),
    "gates/test_k15_k16_block_sizes.py": ("tests/vllm/test_k16_no_load.py",),
    "releases.py": ("tests/cli/test_releases_refused.py",),
    "report/__init__.py": ("tests/report/test_figure_marks.py", "tests/report/test_report_hardened.py"),
    "report/ablation.py": ("tests/report/test_figure_marks.py",),
    "report/delays.py": ("tests/report/test_figure_marks.py",),
    "report/figures.py": ("tests/report/test_report_details.py", "tests/report/test_figure_marks.py"),
    "report/history.py": ("tests/report/test_history_style.py",),
    "report/history_marks.py": ("tests/report/test_history_style.py",),
    "report/history_text.py": ("tests/report/test_history_style.py",),
    "report/releases.py": ("tests/report/test_figure_marks.py",),
    "report/sources.py": ("tests/report/test_report_details.py",),
    "results.py": ("tests/cli/test_outputs_hardened.py",),
    "runner.py": ("tests/engine/test_served_nothing.py",),
    "vllm/build.py": ("tests/vllm/test_build_config.py",),
    "vllm/connector_parts.py": ("tests/vllm/test_connector_parts.py",),
    "vllm/foreign.py": ("tests/vllm/test_simple_cpu.py",),
    "vllm/llm_engine.py": ("tests/vllm/test_model_engine_record.py",),
    "vllm/model.py": ("tests/vllm/test_fingerprint_cells.py", "tests/vllm/test_connector_in_vllm.py"),
    "vllm/observe.py": ("tests/vllm/test_foreign_connectors.py",),
    "vllm/regions.py": ("tests/vllm/test_replay_bounds.py",),
    "vllm/replay.py": ("tests/vllm/test_replay_bounds.py",),
    "vllm/rows.py": ("tests/vllm/test_release_rows.py",),
    "vllm/scheduled_writes.py": ("tests/vllm/test_scheduled_writes.py",),
    "vllm/standins/dma.py": ("tests/vllm/test_standins_ordering.py",),
    "vllm/standins/streams.py": ("tests/vllm/test_standins_ordering.py",),
    "vllm/standins/timeline.py": ("tests/vllm/test_standins_ordering.py",),
    "worker/cuda.py": ("tests/worker/test_cuda_bookkeeping.py",),
    "workloads/definition.py": ("tests/workloads/test_resets.py",),
    "workloads/distributions.py": ("tests/workloads/test_distributions.py",),
    "workloads/mooncake.py": ("tests/workloads/test_errors.py",),
}
for _module, _files in _KILLED_SURVIVORS_OF_01948BC.items():
    WHOLE_TESTS_OF[_module] += _files
# Files without code to mutate (a version string, ``python -m``'s entry, empty packages).
LEFT_OUT = ("__init__.py", "cli/__main__.py", "core/__init__.py", "engine/__init__.py")
VLLM_MODULES = frozenset(m for m in WHOLE_TESTS_OF if m.startswith(("vllm/", "gates/")))
