"""The run over the rest of the package (``KVOFFLOAD_MUTATION_SET=whole``, issue 29): its survivors'
new tests and equivalence proofs, as ``fates.py`` keeps the first run's. Keyed
``module:operator:occurrence`` of the run's commit, 01948bc (``.mutation-whole/meta.json``,
results/mutation/tool/whole/score.json): a key names a mutant of that commit only, so the file is
rewritten when the sample is prepared again. ``fates.py`` merges both runs; their modules differ,
so the keys never collide."""

# Each shown failing on its mutant and passing on the unmutated snapshot by the "new" stage.
WHOLE_NEW_TESTS: dict[str, tuple[str, ...]] = {
    "cli/__init__.py:core/ExceptionReplacer:2": (
        "tests/cli/test_interrupt.py::test_a_ctrl_c_with_stdout_full_or_closed_still_ends_with_130_and_one_line[full]",),
    "cli/__init__.py:core/ExceptionReplacer:3": (
        "tests/cli/test_interrupt.py::test_a_ctrl_c_with_stdout_full_or_closed_still_ends_with_130_and_one_line",),
    "cli/app.py:core/NumberReplacer:12": (
        "tests/cli/test_hostile_input.py::test_an_error_line_shows_a_value_up_to_the_longest_word_whole_and_cuts_a_longer_one",),
    "cli/compare.py:core/ReplaceBinaryOperator_Sub_BitXor:2": (
        "tests/cli/test_table_rules.py::test_what_differs_is_three_items_and_a_count_of_the_rest",),
    "cli/releases.py:core/NumberReplacer:18": (
        "tests/cli/test_releases.py::test_the_run_reports_its_time_and_the_table_the_sum_of_its_entries_to_a_tenth",),
    "cli/releases.py:core/AddNot:4": (
        "tests/cli/test_releases.py::test_a_release_that_dies_is_named_with_the_last_line_it_printed",),
    "cli/releases.py:core/ReplaceUnaryOperator_USub_Not:1": (
        "tests/cli/test_releases.py::test_a_release_that_dies_is_named_with_the_last_line_it_printed",),
    "cli/releases.py:core/NumberReplacer:32": (
        "tests/cli/test_releases.py::test_a_table_nested_past_the_parsers_depth_is_refused_with_its_reason_cut_short",),
    "cli/releases.py:core/ReplaceBinaryOperator_Sub_Div:0": (
        "tests/cli/test_releases.py::test_the_run_reports_its_time_and_the_table_the_sum_of_its_entries_to_a_tenth",),
    "cli/run.py:core/AddNot:38": (
        "tests/cli/test_cli.py::test_the_oracle_line_counts_the_requests_it_could_not_compare_and_only_those",),
    "cli/sweep.py:core/NumberReplacer:14": (
        "tests/cli/test_flag_rules.py::test_a_shard_takes_any_count_of_at_least_one_and_fewer_than_20_digits",),
    "cli/sweep.py:core/ReplaceComparisonOperator_GtE_Eq:0": (
        "tests/cli/test_flag_rules.py::test_a_shard_takes_any_count_of_at_least_one_and_fewer_than_20_digits",),
    "counts.py:core/ReplaceOrWithAnd:0": (
        "tests/gate/test_gate_counts.py::test_the_counted_child_given_other_arguments_prints_its_usage_and_counts_nothing[no --]",),
    "report/__init__.py:core/ReplaceUnaryOperator_Delete_Not:6": (
        "tests/report/test_figure_marks.py::test_the_capacity_note_stands_only_where_no_capacity_chart_is_drawn",),
    "report/ablation.py:core/ReplaceBinaryOperator_Add_Pow:2": (
        "tests/report/test_figure_marks.py::test_each_row_of_ablation_panels_is_one_panel_high_with_room_for_the_title_and_footer",),
    "report/ablation.py:core/ReplaceBinaryOperator_Add_Mod:16": (
        "tests/report/test_figure_marks.py::test_a_difference_label_stands_on_its_bar_as_far_below_a_loss_as_above_a_gain",),
    "report/ablation.py:core/AddNot:18": (
        "tests/report/test_figure_marks.py::test_without_a_reference_each_bar_is_labelled_with_its_own_value",),
    "report/ablation.py:core/AddNot:19": (
        "tests/report/test_figure_marks.py::test_without_a_reference_each_bar_is_labelled_with_its_own_value",),
    "report/ablation.py:core/NumberReplacer:130": (
        "tests/report/test_figure_marks.py::test_a_difference_label_stands_on_its_bar_as_far_below_a_loss_as_above_a_gain",),
    "report/delays.py:core/NumberReplacer:116": (
        "tests/report/test_figure_marks.py::test_percentile_bars_of_a_run_stand_side_by_side_within_its_slot",),
    "report/delays.py:core/NumberReplacer:98": (
        "tests/report/test_figure_marks.py::test_with_no_run_differing_each_panel_says_so_in_its_middle",),
    "report/delays.py:core/NumberReplacer:59": (
        "tests/report/test_figure_marks.py::test_a_difference_curve_is_drawn_thicker_than_the_zero_line",),
    "report/delays.py:core/NumberReplacer:91": (
        "tests/report/test_figure_marks.py::test_the_key_names_the_lines_of_the_first_panel",),
    "report/delays.py:core/NumberReplacer:3": (
        "tests/report/test_figure_marks.py::test_a_small_difference_is_drawn_on_an_axis_of_at_least_2_points",),
    "report/figures.py:core/NumberReplacer:19": (
        "tests/report/test_report_details.py::test_the_footer_names_a_dirty_commit_as_such_inside_the_figure",),
    "report/figures.py:core/NumberReplacer:16": (
        "tests/report/test_figure_marks.py::test_a_long_name_is_cut_to_the_longest_slug_ending_in_a_hash_of_the_whole",),
    "report/figures.py:core/NumberReplacer:31": (
        "tests/report/test_figure_marks.py::test_two_capacity_families_of_one_connector_are_numbered_in_path_order",),
    "report/history.py:core/AddNot:3": (
        "tests/report/test_history_style.py::test_seconds_are_shown_in_the_unit_that_fits",),
    "report/history.py:core/AddNot:5": (
        "tests/report/test_history_style.py::test_the_reference_is_green_thick_and_on_top_and_presets_above_the_change_lines",),
    "report/history.py:core/NumberReplacer:152": (
        "tests/report/test_history_style.py::test_two_environments_are_named_in_their_lines",),
    "report/history.py:core/NumberReplacer:101": (
        "tests/report/test_history_style.py::test_the_reference_is_green_thick_and_on_top_and_presets_above_the_change_lines",),
    "report/history.py:core/NumberReplacer:154": (
        "tests/report/test_history_style.py::test_a_pooled_line_of_two_machines_keeps_the_first_machines_colour",),
    "report/history.py:core/NumberReplacer:164": (
        "tests/report/test_history_style.py::test_a_rate_starts_at_0_and_keeps_room_above_its_largest_value",),
    "report/history.py:core/NumberReplacer:162": (
        "tests/report/test_history_style.py::test_a_rate_starts_at_0_and_keeps_room_above_its_largest_value",),
    "report/history.py:core/NumberReplacer:166": (
        "tests/report/test_history_style.py::test_a_rate_starts_at_0_and_keeps_room_above_its_largest_value",),
    "report/history.py:core/AddNot:34": (
        "tests/report/test_history_style.py::test_a_spread_bar_stands_where_asv_kept_quartiles",),
    "report/history.py:core/ReplaceComparisonOperator_NotEq_IsNot:2": (
        "tests/report/test_history_style.py::test_a_long_line_is_broken_only_where_a_commit_has_no_result",),
    "report/history_marks.py:core/NumberReplacer:23": (
        "tests/report/test_history_style.py::test_a_commits_arrow_stands_centred_over_its_slot",),
    "report/history_text.py:core/ReplaceAndWithOr:0": (
        "tests/report/test_history_style.py::test_a_single_sample_with_quartiles_still_measured_no_spread",),
    "report/releases.py:core/ReplaceBinaryOperator_Add_FloorDiv:2": (
        "tests/report/test_figure_marks.py::test_the_agreement_axis_ends_just_above_every_request_agreeing",),
    "report/releases.py:core/ReplaceBinaryOperator_Add_BitXor:4": (
        "tests/report/test_figure_marks.py::test_five_panels_and_the_key_each_get_a_place_of_their_own",),
    "report/sources.py:core/AddNot:28": (
        "tests/report/test_report_details.py::test_asv_values_are_read_as_asv_writes_them",),
    "report/sources.py:core/ReplaceOrWithAnd:19": (
        "tests/report/test_report_details.py::test_asv_values_are_read_as_asv_writes_them",),
    "report/sources.py:core/NumberReplacer:16": (
        "tests/report/test_report_details.py::test_asv_values_are_read_as_asv_writes_them",),
    "results.py:core/NumberReplacer:16": (
        "tests/cli/test_outputs_hardened.py::test_a_folders_clean_up_by_name_prefix_removes_only_the_left_overs_of_names_so_begun",),
    "runner.py:core/ReplaceOrWithAnd:5": (
        "tests/engine/test_served_nothing.py::test_only_a_connector_that_neither_served_nor_crashed_served_nothing",),
    "sweep_workers.py:core/ReplaceFalseWithTrue:1": (
        "tests/sweep/test_sweep_processes.py::test_a_worker_is_tied_to_the_sweep_by_the_kernel_on_linux_and_by_a_watch_elsewhere[darwin-0 MainThread parent-watch]",),
    "sweep_workers.py:core/ReplaceComparisonOperator_Eq_Lt:0": (
        "tests/sweep/test_sweep_processes.py::test_a_worker_is_tied_to_the_sweep_by_the_kernel_on_linux_and_by_a_watch_elsewhere[linux-15 MainThread]",),
    "sweep_workers.py:core/AddNot:7": (
        "tests/sweep/test_sweep_processes.py::test_a_worker_is_tied_to_the_sweep_by_the_kernel_on_linux_and_by_a_watch_elsewhere[linux-15 MainThread]",),
    "worker/cuda.py:core/AddNot:3": (
        "tests/worker/test_cuda_bookkeeping.py::test_a_drain_synchronizes_the_last_transfer_of_each_busy_direction",),
    "workloads/definition.py:core/NumberReplacer:7": (
        "tests/workloads/test_resets.py::test_a_reset_list_as_long_as_usage_md_allows_is_read_and_one_step_more_refused",),
    "workloads/distributions.py:core/ReplaceComparisonOperator_Gt_LtE:6": (
        "tests/workloads/test_distributions.py::test_a_poisson_tail_point_under_the_pmf_in_the_narrow_strip_is_accepted",),
    "workloads/mooncake.py:core/ReplaceFalseWithTrue:1": (
        "tests/workloads/test_errors.py::TestMooncakeTraces::test_a_number_too_long_to_read_is_named_at_its_line_once",),
    "workloads/sizing.py:core/ReplaceBinaryOperator_FloorDiv_Pow:1": (
        "tests/perf/test_sizing.py::test_a_size_smaller_than_one_chunk_is_rejected_naming_what_a_chunk_holds",),
    "workloads/sizing.py:core/NumberReplacer:15": (
        "tests/perf/test_sizing.py::test_cpu_chunks_in_bytes_hold_that_much_kv_at_the_profiles_width[0.0015 TB-1500000000]",),
    "workloads/sizing.py:core/ReplaceBinaryOperator_Pow_Add:0": (
        "tests/perf/test_sizing.py::test_cpu_chunks_in_bytes_hold_that_much_kv_at_the_profiles_width[1500000 kB-1500000000]",),
    "cli/releases_family.py:core/AddNot:4": (
        "tests/cli/test_releases_family.py::test_the_earlier_matrix_is_read_back_and_anything_else_in_its_place_is_no_rows",),
    "core/hybrid_stores.py:core/NumberReplacer:34": (
        "tests/core/test_hybrid_connector.py::test_the_stats_count_each_store_job_and_each_chunk_it_hands_over_once[qwen3-next-multi-turn-small]",),
    "core/hybrid_stores.py:core/NumberReplacer:10": (
        "tests/core/test_hybrid_connector.py::test_the_stats_count_each_store_job_and_each_chunk_it_hands_over_once[qwen3-next-multi-turn-small]",),
    "core/model.py:core/NumberReplacer:4": (
        "tests/engine/test_kv_groups.py::test_a_window_of_any_positive_length_belongs_to_a_sliding_window_group_and_only_there",),
    "engine/mamba.py:core/ZeroIterationForLoop:2": (
        "tests/engine/test_mamba_rules.py::TestRowBookkeeping::test_a_request_admitted_on_a_cached_state_lets_the_hits_block_go_once_past_it",),
    "release_io.py:core/NumberReplacer:46": (
        "tests/cli/test_releases_hardened.py::test_what_a_release_prints_is_checked_and_refused_in_one_line[a hit count no int64 holds]",),
    "release_io.py:core/AddNot:26": (
        "tests/cli/test_releases_hardened.py::test_what_a_release_prints_is_checked_and_refused_in_one_line[an admission of one number]",),
    "gates/test_k15_k16_block_sizes.py:core/NumberReplacer:16": (
        "tests/vllm/test_k16_no_load.py::test_a_connector_that_serves_nothing_admits_c_with_a_load_ending_at_0",),
    "vllm/foreign.py:core/ReplaceBinaryOperator_Mul_BitXor:1": (
        "tests/vllm/test_simple_cpu.py::test_simple_cpus_tier_holds_cpu_chunks_chunks_of_blocks_per_chunk_blocks",),
    "vllm/standins/dma.py:core/ReplaceComparisonOperator_Lt_NotEq:0": (
        "tests/vllm/test_standins_ordering.py::test_a_source_block_anywhere_outside_its_region_is_refused",),
    "vllm/standins/streams.py:core/AddNot:0": (
        "tests/vllm/test_standins_ordering.py::test_a_copy_ordered_after_another_streams_event_lands_that_streams_copy_first",),
    "vllm/standins/timeline.py:core/NumberReplacer:18": (
        "tests/vllm/test_standins_ordering.py::test_copies_complete_completion_steps_forwards_after_the_one_they_landed_in",),
    "gates/story.py:core/AddNot:2": (
        "tests/vllm/test_story_helpers.py::test_the_gpu_prefix_cache_is_forgotten_only_before_the_steps_a_story_names",),
    "gates/test_k01_k05_finish.py:core/NumberReplacer:3": ("tests/vllm/test_gates_flag_plants.py",),
    "vllm/build.py:core/NumberReplacer:7": (
        "tests/vllm/test_build_config.py::test_the_stock_connector_makes_the_workloads_cpu_chunks_on_a_dense_and_a_hybrid_model",),
    "vllm/connector.py:core/NumberReplacer:4": (
        "tests/vllm/test_connector_in_vllm.py::test_a_chunk_of_one_gpu_block_in_tokens_is_one_block_per_chunk",),
    "vllm/connector.py:core/ReplaceOrWithAnd:5": ("tests/vllm/test_connector_in_vllm.py::test_bad_options_are_named",),
    "vllm/llm_engine.py:core/AddNot:37": (
        "tests/vllm/test_model_engine_record.py::test_leaks_are_unmeasured_only_for_a_connector_that_keeps_no_request_table",),
    "vllm/llm_engine.py:core/AddNot:33": (
        "tests/vllm/test_model_engine_record.py::test_what_the_connector_still_tracks_after_a_clean_run_is_leaked",),
    "vllm/model.py:core/ReplaceBinaryOperator_FloorDiv_LShift:3": (
        "tests/vllm/test_fingerprint_cells.py::test_a_mamba_states_cells_are_the_first_two_words_of_its_block_in_every_layer",),
    "vllm/regions.py:core/ReplaceFalseWithTrue:1": (
        "tests/vllm/test_replay_bounds.py::test_the_copy_volume_recorded_is_every_stored_chunk_and_every_loaded_block_in_bytes",),
    "vllm/regions.py:core/NumberReplacer:69": (
        "tests/vllm/test_replay_bounds.py::test_the_copy_volume_recorded_is_every_stored_chunk_and_every_loaded_block_in_bytes",),
    "vllm/rows.py:core/NumberReplacer:31": (
        "tests/vllm/test_release_rows.py::test_an_unknown_control_is_named_in_one_line_before_any_job_runs",),
    "vllm/rows.py:core/NumberReplacer:34": (
        "tests/vllm/test_release_rows.py::test_without_a_job_the_child_prints_its_usage_and_exits_2",),
    "vllm/rows.py:core/ReplaceComparisonOperator_Eq_Lt:2": (
        "tests/vllm/test_release_rows.py::test_an_unknown_control_is_named_in_one_line_before_any_job_runs",),
    "vllm/rows.py:core/ReplaceUnaryOperator_Delete_USub:1": (
        "tests/vllm/test_release_rows.py::test_a_crashed_connectors_row_keeps_its_message_step_and_innermost_frames",),
    "vllm/rows.py:core/NumberReplacer:15": (
        "tests/vllm/test_release_rows.py::test_without_a_job_the_child_prints_its_usage_and_exits_2",),
    "vllm/scheduled_writes.py:core/NumberReplacer:3": (
        "tests/vllm/test_scheduled_writes.py::test_a_plain_request_wrote_every_scheduled_token_and_a_drafting_one_its_accepted_drafts",),
    "vllm/stock.py:core/ReplaceOrWithAnd:0": (
        "tests/vllm/test_stock_and_broken.py::test_a_single_groups_spec_in_either_form_is_one_plain_job",),
}

# Each with its probe in probes_whole.py (run by probes.py).
WHOLE_FATES: dict[str, tuple[str, str]] = {
    "gate_baseline.py:core/ReplaceComparisonOperator_NotEq_Lt:1": (
        "equivalent",
        "`resolved.returncode != 0` made `< 0`: a failed `git rev-parse --verify --quiet` exits 1 and "
        "prints nothing, which `not commit` refuses either way (probes_whole.py: "
        "failed_rev_parse_prints_nothing)"),
    "report/delays.py:core/NumberReplacer:9": (
        "survived",
        "the subtitle's wrap width 150 made 149: only where a line breaks moves; a test would restate the"
        " constant"),
    "report/figures.py:core/NumberReplacer:62": (
        "equivalent",
        "draw_capacity's key taken from axes[1] instead of axes[0]: both panels plot every series in the "
        "same order with the same label, colour and marker (a missing value is a NaN point, not a missing"
        " line), and a legend draws its samples from the handle's style, not its data, so the key and the"
        " PNG are the same (probes_whole.py: capacity_key_is_the_same_from_either_panel)"),
    "report/history.py:core/NumberReplacer:187": (
        "survived",
        "the change mark's label offset -9 made -8 points: a test would restate the constant"),
    "report/history.py:core/NumberReplacer:36": (
        "survived",
        "the sixth line style's dashes (1, 3) made (2, 3): still distinct from the other five"),
    "report/history_marks.py:core/ReplaceUnaryOperator_USub_Invert:0": (
        "survived",
        "the arrow label 4 points below the panel's top instead of 3: a test would restate the constant"),
    "report/history_text.py:core/ReplaceComparisonOperator_Gt_NotEq:0": (
        "equivalent",
        "one_sample's `p.samples > 1` made `!= 1`: a point's sample count is at least 1 whatever the "
        "result file says, and on 1, 2, ... the two agree (probes_whole.py: samples_are_at_least_one)"),
    "report/releases.py:core/NumberReplacer:141": (
        "survived",
        "the 'Not drawn' subtitle's wrap width 150 made 149: a test would restate the constant"),
    "report/releases.py:core/NumberReplacer:56": (
        "survived",
        "the release figure's title room 0.9 in made 1.9 in: a taller figure, nothing overlaps or goes "
        "missing"),
    "results.py:core/ReplaceBinaryOperator_Mul_Div:1": (
        "equivalent",
        "`*, prefix` made `/, prefix`: every call in the checkout (package, tests, benchmarks, scripts) "
        "passes folder and names by position and prefix only by keyword, and the function is used nowhere"
        " but in such calls, so both signatures bind every call alike (probes_whole.py: "
        "left_overs_are_removed_by_position_and_prefix_keyword)"),
    "workloads/definition.py:core/NumberReplacer:22": (
        "equivalent",
        "`match.group(1)` made `match.group(2)` in the position test: both groups sit in one alternative "
        "of _TOML_POSITION, each `\\d+` (never empty), the other alternative has neither, so a match has "
        "both or none (probes_whole.py: toml_positions_name_a_line_and_a_column_together)"),
    "workloads/distributions.py:core/NumberReplacer:11": (
        "equivalent",
        "poisson()'s default floor 0 made -1: the floor only clamps a draw from below, and a Poisson draw"
        " is never negative (PTRS's fast acceptance gives k >= 4 for every mean from 10 on, its other "
        "path continues on k < 0), so max(k, 0) == max(k, -1) (probes_whole.py: "
        "poisson_draws_are_never_negative)"),
    "workloads/schema.py:core/ReplaceComparisonOperator_Lt_LtE:0": (
        "survived",
        "abs(value) < 2**1023 made <=: only the integer 2**1023 tells them apart, a float holds it "
        "exactly, and nothing after the check differs"),
    "engine/bounded.py:core/NumberReplacer:23": (
        "equivalent",
        "`_ticks_seen = -1` made `- 0` in __init__: only the alarm's check, defined inside watching(), "
        "reads it, and watching() sets it to -1 first; no other module names it, so the initial value is "
        "never read (probes_whole.py: the_step_alarm_forgets_what_it_saw_when_it_starts_watching)"),
    "gates/test_k13_composed.py:core/ReplaceTrueWithFalse:0": (
        "survived",
        "K13's expected failure for stock made lax (strict=False): stock still fails K13, so an xfail "
        "either way; only a stock that fixed it would show (an XPASS)"),
    "gates/test_k14_k19_hybrid.py:core/NumberReplacer:17": (
        "survived",
        "K14's B prompt seeded 2 instead of 3: the story passes for stock and the reference and still "
        "fails for its plant in CI (StaleWindowBlocksConnector)"),
    "vllm/foreign.py:core/ReplaceTrueWithFalse:0": (
        "equivalent",
        "Family frozen=False differs only in allowing field assignment/deletion and dropping __hash__; no"
        " code of the package assigns, deletes or hashes a family (nor keys a set/dict by one), so every "
        "run is the same (probes_whole_vllm.py: no_family_is_changed_or_hashed)"),
    "vllm/standins/threads.py:core/ReplaceTrueWithFalse:0": (
        "equivalent",
        "InlineQueue.put (and put_nowait, the same function) never reads its block argument: only the "
        "default of an unread parameter changes (probes_whole_vllm.py: "
        "the_stand_in_queue_never_reads_block)"),
    "gates/story.py:core/NumberReplacer:27": (
        "survived",
        "a follow-up's output seed 78 made 77: no story reads a follow-up's output tokens"),
    "gates/story.py:core/NumberReplacer:10": (
        "survived",
        "MAX_STEPS 400 made 401: every story ends far below the bound, and one that does not fails at "
        "either"),
    "gates/test_k01_k05_finish.py:core/NumberReplacer:89": (
        "survived",
        "K05's bound connector_at_least 28 made 27: stock and the reference serve more, the planted "
        "NeverServesConnector 0; only a connector serving exactly 27 of B's 32 tokens tells them apart"),
    "gates/test_k01_k05_finish.py:core/NumberReplacer:9": (
        "survived",
        "K01's store completion 4 steps made 3: the story passes for stock and the reference and still "
        "fails for its plant in CI (deferred_finish_signal off)"),
    "gates/test_k06_k20_lifecycle.py:core/NumberReplacer:86": (
        "survived",
        "K08's D aborted a step later: the story passes for stock and the reference; its bug shows only "
        "in vLLM 0.26's venv"),
    "gates/test_k06_k20_lifecycle.py:core/NumberReplacer:207": (
        "survived",
        "K20's precondition preemptions >= 1 made >= 0: vLLM 0.32 preempts in that story, so the check "
        "passes either way in CI"),
    "gates/test_k06_k20_lifecycle.py:core/NumberReplacer:19": (
        "survived",
        "K07's R prompt seeded 0 instead of 1: the story passes for stock and the reference; its assert "
        "shows only in vLLM 0.26's venv"),
    "gates/test_k06_k20_lifecycle.py:core/NumberReplacer:32": (
        "survived",
        "K07's Q with 5 outputs instead of 4: as above, 0.26 only"),
    "gates/test_k06_k20_lifecycle.py:core/ReplaceComparisonOperator_GtE_LtE:0": (
        "survived",
        "K09's preemptions >= 1 made <= 1: vLLM 0.32 preempts once here; 0.25-0.29 (twice) would fail the"
        " mutant, in their venvs only"),
    "gates/test_k21_k30_tier.py:core/NumberReplacer:111": (
        "survived",
        "K25's A output seeded 1 instead of 2: the story passes for stock and the reference and still "
        "fails for its plant in CI (FailedAllocationSkippedConnector)"),
    "gates/test_k21_k30_tier.py:core/NumberReplacer:133": (
        "survived",
        "K25's store completion 3 steps made 2: the story passes for stock and the reference and still "
        "fails for its plant in CI (FailedAllocationSkippedConnector)"),
    "gates/test_k21_k30_tier.py:core/NumberReplacer:150": (
        "survived",
        "K27's store completion 4 steps made 5: the story passes for stock and the reference and still "
        "fails for its plant in CI (NeverDefersConnector)"),
    "gates/test_k21_k30_tier.py:core/NumberReplacer:96": (
        "survived",
        "K23's A prompt seeded 2 instead of 1: the story passes for stock and the reference and still "
        "fails for its plants in CI (NeverDefersConnector, FailedStoreVisibleConnector)"),
    "vllm/model.py:core/ReplaceOrWithAnd:2": (
        "equivalent",
        "a preempted request's tables are read only when it is scheduled again, and vLLM schedules it "
        "again only as new or resumed, where update() sets its tables afresh: the kept (undropped) tables"
        " are never read (probes_whole_vllm.py: the_preempted_tables_are_never_read_again)"),
    "vllm/model.py:core/ReplaceBinaryOperator_LShift_RShift:0": (
        "equivalent",
        "the fingerprint mask `(1 << 64) - 1` made `(1 >> 64) - 1` (-1): every masked value is then taken"
        " mod 2**64 (extend_fingerprint masks its result, to_signed_int maps a value and its unsigned "
        "twin alike), so drafts and writes past a script are the same (probes_whole.py: "
        "signed_or_unsigned_fingerprints_extend_alike)"),
    "vllm/pinned.py:core/ReplaceTrueWithFalse:2": (
        "equivalent",
        "use_errno only keeps a private errno copy for ctypes.get_errno; the module never reads errno nor"
        " the prctl's return value, and prctl answers the same through both handles "
        "(probes_whole_vllm.py: errno_is_never_read_after_the_prctl)"),
    "vllm/replay.py:core/ReplaceAndWithOr:7": (
        "equivalent",
        "the extra draft hand-outs are ignored by vLLM (prefill chunks), empty over empty (no speculative"
        " decoding), or k fillers over the async scheduler's k placeholders; only the count of scheduled "
        "drafts is ever read (probes_whole_vllm.py: drafts_for_the_others_change_nothing)"),
}
