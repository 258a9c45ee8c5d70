"""Every check that can write ``pass`` and the test(s) that drive it to ``fail`` (issue #30).

``REPRODUCERS[(suite, check)]``: node ids (no parametrization) of tests that make that check write a
``fail`` row in the pytest process itself (a fault, a corrupted input or an injected reading); rows
written in a subprocess are not seen. Held to the code by tests/test_every_check_can_fail.py (a
static scan of every check name that can be written with ``pass``) and, at the end of every
session, by tests/check_recorder.py (a listed test that ran and passed did write the ``fail`` row).
A new check that can pass needs an entry here, and a test.
"""

from __future__ import annotations

CAP = "tests/test_capture_can_fail.py"
RCLI = "tests/test_replay_cli.py"
RFAIL = "tests/test_replay_can_fail.py"
NUM = "tests/test_numerics.py"
NUMF = "tests/test_numerics_can_fail.py"
SE = "tests/test_soft_errors_run.py"
SEF = "tests/test_soft_errors_can_fail.py"
RATES = "tests/test_rate_verdicts.py"
SURE = "tests/test_soft_errors_sure_verdict.py"
COR = "tests/test_correctness.py"
ONNX = "tests/test_onnx.py"
ONNXF = "tests/test_onnx_can_fail.py"
DIST = "tests/test_distributed_merge.py"
PERFT = "tests/test_performance.py"
PERF = "tests/test_performance_can_fail.py"
SELF = "tests/test_selftest_verdict.py"
PRED = "tests/test_predict.py"

REPRODUCERS: dict[tuple[str, str], tuple[str, ...]] = {
    # capture
    ("capture", "trace_recorded"): (f"{CAP}::test_trace_recorded_fails_when_the_step_runs_no_aten_op",),
    # replay
    ("replay", "replay_coverage"): (
        f"{RCLI}::test_a_filtered_benchmark_reports_coverage_of_the_original_and_no_comparable_ratio",),
    ("replay", "replay_coverage_by_time"): (f"{RCLI}::test_coverage_by_time_is_judged_on_its_own_value",),
    ("replay", "replay_output_fallbacks"): (
        f"{RCLI}::test_synthetic_outputs_over_one_percent_of_the_ops_fail",),
    ("replay", "replay_step_time_ratio"): (
        f"{RCLI}::test_the_ratio_verdict_comes_from_the_paired_interval",
        f"{RCLI}::test_a_step_the_replay_cannot_reproduce_in_time_fails",
        # host-bound and device-bound steps, each judged on its own time (issue 33)
        "tests/test_replay_boundness.py::test_replay_says_what_bounds_the_step_and_which_time_it_judged",),
    ("replay", "replay_process_consistency"): (
        "tests/test_replay_consistency.py::test_the_command_reads_gpu_checks_folders_and_writes_one_row_per_capture",),
    ("replay", "replay_routing_reproduced"): (
        "tests/test_routing.py::test_replay_gives_the_ops_the_recorded_loads_and_the_check_can_fail",),
    ("replay", "routing_skew_prediction_error"): (
        "tests/test_routing_skew.py::test_the_check_fails_when_the_step_moves_otherwise_than_predicted",
        # timed rounds (fake clock): a step that moves otherwise than predicted fails beyond the null's floor
        "tests/test_against_rounds.py::test_a_step_that_moves_otherwise_than_predicted_fails_beyond_the_floor",),
    ("replay", "routing_skew_special_values"): (
        "tests/test_routing_skew.py::test_a_replayed_state_of_special_values_makes_the_comparison_an_error",),
    ("replay", "dispatch_overhead_ratio"): (
        f"{RFAIL}::test_dispatch_overhead_ratio_fails_when_the_replay_takes_twice_the_eager_time",),
    # predict
    ("predict", "prediction_error"): (f"{PRED}::test_a_verified_prediction_is_judged_on_its_error_interval",),
    # numerics
    ("numerics", "conversion_exact"): (f"{NUM}::test_flushing_fp16_subnormals_fails_only_fp16",),
    ("numerics", "conversion_round_nearest_even"): (
        f"{NUM}::test_round_toward_zero_conversions_fail_with_examples",),
    ("numerics", "conversion_near_tie"): (f"{NUM}::test_round_toward_zero_conversions_fail_with_examples",),
    ("numerics", "conversion_widening_exact"): (
        f"{NUMF}::test_conversion_widening_exact_fails_when_widening_is_off_by_one_ulp",),
    ("numerics", "subnormals"): (f"{NUM}::test_flushing_fp16_subnormals_fails_only_fp16",),
    ("numerics", "overflow_to_inf"): (f"{NUMF}::test_overflow_to_inf_fails_when_multiplication_saturates",),
    ("numerics", "nan_propagation"): (f"{NUMF}::test_nan_propagation_fails_when_addition_drops_nans",),
    ("numerics", "signed_zero"): (f"{NUMF}::test_signed_zero_fails_when_negation_loses_the_sign_of_zero",),
    ("numerics", "normwise_error"): (
        f"{NUM}::test_bf16_accumulating_gemm_fails_probe_and_bounds",
        f"{NUM}::test_results_pushed_past_the_ulp_bound_fail",),
    ("numerics", "componentwise_error"): (f"{NUM}::test_bf16_accumulating_gemm_fails_probe_and_bounds",),
    ("numerics", "max_ulp_error"): (f"{NUM}::test_results_pushed_past_the_ulp_bound_fail",),
    ("numerics", "accumulator_precision"): (f"{NUM}::test_bf16_accumulating_gemm_fails_probe_and_bounds",),
    ("numerics", "order_dependence"): (
        f"{NUM}::test_order_dependence_beyond_the_fp32_accumulation_bound_fails",),
    ("soft_errors", "abft_grouped_gemm"): (
        "tests/test_abft_grouped_gemm.py::test_clean_groups_pass_and_a_faulty_grouped_kernel_fails",),
    ("numerics", "moe_router_flips"): ("tests/test_moe_numerics.py::test_a_stuck_router_lane_flips_beyond_the_bound",),
    ("numerics", "repeatability"): (f"{NUM}::test_nondeterministic_gemm_fails_repeatability",),
    ("numerics", "model_layer_deviation"): (
        f"{NUMF}::test_model_deviation_checks_fail_when_matmuls_are_ten_percent_off",),
    ("numerics", "model_output_deviation"): (
        f"{NUMF}::test_model_deviation_checks_fail_when_matmuls_are_ten_percent_off",),
    ("numerics", "model_train_deviation"): (
        f"{NUMF}::test_model_deviation_checks_fail_when_matmuls_are_ten_percent_off",),
    ("numerics", "attention_backend_deviation"): (
        f"{NUMF}::test_attention_backend_deviation_fails_when_the_fused_kernel_is_off_and_math_is_not",),
    # soft_errors
    ("soft_errors", "abft_gemm"): (
        f"{SE}::test_abft_gemm_clean_row_fails_when_the_product_differs_from_the_golden_beyond_its_bound",
        f"{SE}::test_cli_exits_1_when_an_injected_fault_is_detected",),
    ("soft_errors", "abft_embedding_bag"): (
        f"{SEF}::test_abft_embedding_bag_fails_when_the_table_changed_after_its_checksums",),
    ("soft_errors", "abft_fbgemm"): (
        f"{SEF}::test_abft_fbgemm_fails_when_the_tbe_rows_changed_after_their_checksums",),
    ("soft_errors", "false_positives"): (
        f"{SEF}::test_false_positives_fails_when_the_device_corrupts_clean_products",),
    ("soft_errors", "detection_campaign"): (
        f"{RATES}::test_one_miss_in_ten_fails",
        f"{RATES}::test_a_screen_reports_an_undecided_rate_as_a_measurement_and_checks_its_misses",
        f"{RATES}::test_a_missed_sure_flip_fails_and_one_below_the_resolution_does_not",
        f"{SURE}::test_the_campaign_fails_when_the_checkers_threshold_is_100_times_the_derived_one",),
    ("soft_errors", "pvf_control"): (
        f"{SE}::test_pvf_control_fails_on_a_device_that_changes_the_output_without_any_flip",),
    ("soft_errors", "sdc_screen"): (
        f"{SEF}::test_sdc_screen_fails_when_one_run_of_a_kernel_differs_from_the_others",),
    ("soft_errors", "overhead"): (
        f"{SE}::test_overhead_verdicts_come_from_the_interval_not_the_median_alone",),
    # correctness
    ("correctness", "first_divergent_op"): (
        f"{COR}::test_bitflips_in_exponents_fail_at_the_first_matrix_multiply",),
    ("correctness", "max_error_ratio"): (
        f"{COR}::test_bitflips_in_exponents_fail_at_the_first_matrix_multiply",),
    ("correctness", "op_error_vs_fp64"): (
        f"{COR}::test_bitflips_in_exponents_fail_at_the_first_matrix_multiply",),
    ("correctness", "target_op_errors"): (
        f"{COR}::test_missing_kernels_are_skipped_and_raising_kernels_fail",),
    ("correctness", "workload_output_error"): (
        f"{COR}::test_bitflips_in_exponents_fail_at_the_first_matrix_multiply",),
    ("correctness", "replay_repeatability"): (
        f"{COR}::test_reordered_reductions_pass_the_comparison_but_fail_repeatability",),
    ("correctness", "workload_repeatability"): (
        f"{COR}::test_reordered_reductions_pass_the_comparison_but_fail_repeatability",),
    # onnx
    ("onnx", "onnx_export"): (f"{ONNXF}::test_onnx_export_fails_when_the_exporter_refuses_the_model",),
    ("onnx", "onnx_checker"): (
        f"{ONNXF}::test_onnx_checker_and_shape_inference_fail_on_a_model_that_adds_an_integer_to_a_float",),
    ("onnx", "onnx_shape_inference"): (
        f"{ONNXF}::test_onnx_checker_and_shape_inference_fail_on_a_model_that_adds_an_integer_to_a_float",),
    ("onnx", "onnx_output_deviation"): (f"{ONNX}::test_validator_flags_a_deviating_output",),
    ("onnx", "onnx_intermediate_deviation"): (f"{ONNX}::test_validator_flags_a_deviating_output",),
    ("onnx", "torch_lowp_error_vs_fp64"): (
        f"{ONNXF}::test_low_precision_errors_fail_when_the_half_precision_outputs_are_off",),
    ("onnx", "onnx_lowp_error_vs_fp64"): (
        f"{ONNXF}::test_low_precision_errors_fail_when_the_half_precision_outputs_are_off",),
    # distributed (merge's own rows; a rank's rows are written in its own process)
    ("distributed", "collectives_replayed"): (
        f"{DIST}::test_coverage_fails_when_a_collective_was_not_replayed",),
    # performance
    ("performance", "throughput_drift"): (
        f"{PERF}::test_throughput_drift_fails_when_the_last_third_of_a_long_run_is_much_slower",),
    ("performance", "clock_drop"): (
        f"{PERF}::test_clock_drop_fails_when_the_clock_falls_a_quarter_during_the_run",),
    ("performance", "host_contention"): (
        f"{PERF}::test_host_contention_is_inconclusive_when_no_step_ran_undisturbed",),
    ("performance", "mode_slowdown"): (
        f"{PERF}::test_mode_slowdowns_fail_when_the_injected_mode_doubles_every_step",),
    ("performance", "mode_mean_slowdown"): (
        f"{PERF}::test_mode_slowdowns_fail_when_the_injected_mode_doubles_every_step",),
    ("performance", "fleet_gemm_throughput"): (
        f"{PERF}::test_every_fleet_figure_fails_on_a_device_twice_as_slow_as_its_peers",),
    ("performance", "fleet_memory_bandwidth"): (
        f"{PERF}::test_every_fleet_figure_fails_on_a_device_twice_as_slow_as_its_peers",),
    ("performance", "fleet_transfer_bandwidth"): (
        f"{PERF}::test_every_fleet_figure_fails_on_a_device_twice_as_slow_as_its_peers",),
    ("performance", "fleet_step_time"): (
        f"{PERF}::test_every_fleet_figure_fails_on_a_device_twice_as_slow_as_its_peers",),
    ("performance", "fleet_outlier"): (
        f"{PERFT}::test_fleet_names_the_outlier_and_states_the_synchronous_slowdown",),
    ("performance", "campaign_flagged"): (
        f"{PERF}::test_campaign_flagged_fails_when_the_fault_goes_unseen_and_a_healthy_run_is_flagged",),
    # selftest
    ("selftest", "healthy_false_failures"): (f"{SELF}::test_an_error_row_on_the_healthy_device_fails_it",),
    ("selftest", "fault_caught"): (
        f"{SELF}::test_error_and_inconclusive_rows_under_a_fault_are_not_a_catch",),
}

#: checks whose bad outcome is not ``fail`` by design: the status their reproducer must write instead
FAILS_AS: dict[tuple[str, str], str] = {
    # a host too busy to leave undisturbed steps says nothing about the device: the run's figures are
    # not comparable (inconclusive), the device did not fail (validators/performance/sustained.py)
    ("performance", "host_contention"): "inconclusive",
}

#: check names formed at run time (an f-string the scan reads as a pattern) -> the names they form
DYNAMIC: dict[str, tuple[str, ...]] = {
    # validators/performance/compare.py: f"fleet_{check}" over the figures fleet.COMPARED compares
    "fleet_*": ("fleet_gemm_throughput", "fleet_memory_bandwidth", "fleet_transfer_bandwidth",
                "fleet_step_time"),
}

#: names the scan finds written with a status it cannot read, that can never be ``pass`` (with why)
EXEMPT: dict[str, str] = {
    # validators/soft_errors/checks/pvf.py: rate_rows(..., target=None) gives a measurement (info; skip
    # with no trial) and the only other pvf row is a skip; the PVF's check is pvf_control
    "pvf": "rate_rows without a target writes info (skip without trials): the PVF is a measurement",
}
