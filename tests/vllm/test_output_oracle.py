"""The output oracle's comparison on hand-made outcomes (no vLLM needed): what counts as the same
request, the first difference it names, and the chunk it blames."""

from __future__ import annotations

import pytest

from kvoffload.vllm.outputs import LOGPROB_TOLERANCE, RequestOutcome, compare_outputs

TPC = 32  # tokens per chunk


def outcome(req_id, prompt_len=40, tokens=(5, 6, 7, 8), logprobs=(-1.0, -2.0, -3.0, -4.0), **kw):
    return RequestOutcome(req_id, tuple(range(100, 100 + prompt_len)), list(tokens), list(logprobs), **kw)


def test_equal_outputs_are_identical_and_the_largest_delta_is_kept():
    run = {"a": outcome("a", logprobs=(-1.0, -2.0004, -3.0, -4.0))}
    report = compare_outputs(run, {"a": outcome("a")}, tokens_per_chunk=TPC, tolerance=1e-3)
    assert (report.identical, report.mismatches, report.compared) == (["a"], [], 1)
    assert report.max_logprob_delta == pytest.approx(4e-4)


def test_a_changed_token_names_the_request_its_position_and_the_chunk_loaded_for_it():
    # The follow-up loaded positions 32-63 (chunk 1) and 64-70 (chunk 2, part of it): both named.
    ours = outcome("b", prompt_len=80, tokens=(5, 6, 9, 8), loaded=[(32, 64), (64, 70)])
    report = compare_outputs({"a": outcome("a"), "b": ours}, {"a": outcome("a"), "b": outcome("b", prompt_len=80)},
                             tokens_per_chunk=TPC, tolerance=1e-3)
    assert report.identical == ["a"]
    (mismatch,) = report.mismatches
    assert (mismatch.req_id, mismatch.position, mismatch.kind, mismatch.loaded_chunks) == ("b", 2, "token", (1, 2))
    assert mismatch.describe() == ("request b: output position 2 (sequence position 82) has token 9 instead of 7; "
                                   "chunks 1, 2 loaded for it")
    assert report.as_dict()["first_mismatch"] == {"request": "b", "position": 2, "kind": "token",
                                                  "loaded_chunks": [1, 2]}


def test_logprobs_count_for_the_first_n_tokens_only_and_beyond_the_tolerance_only():
    base = outcome("a", logprobs=(-1.0, -2.0, -3.0, -4.0))
    within = outcome("a", logprobs=(-1.0009, -2.0, -3.0, -4.0))  # 9e-4 < 1e-3
    past_n = outcome("a", logprobs=(-1.0, -2.0, -3.5, -4.0))  # position 2, first_n = 2
    beyond = outcome("a", logprobs=(-1.0, -2.5, -3.0, -4.0))
    assert compare_outputs({"a": within}, {"a": base}, tokens_per_chunk=TPC, tolerance=1e-3).identical == ["a"]
    assert compare_outputs({"a": past_n}, {"a": base}, tokens_per_chunk=TPC, first_n=2,
                           tolerance=1e-3).identical == ["a"]
    (mismatch,) = compare_outputs({"a": beyond}, {"a": base}, tokens_per_chunk=TPC, tolerance=1e-3).mismatches
    assert (mismatch.position, mismatch.kind, mismatch.ours, mismatch.theirs) == (1, "logprob", -2.5, -2.0)


def test_a_logprob_of_minus_infinity_in_both_runs_is_the_same_and_against_a_number_is_not():
    # A token the model gives no probability at all (an underflow to -inf, a masked id) may be
    # sampled in neither run: equal infinities are no difference, -inf against a number is one.
    base = outcome("a", logprobs=(-1.0, -float("inf"), -3.0, -4.0))
    report = compare_outputs({"a": outcome("a", logprobs=(-1.0, -float("inf"), -3.0, -4.0))}, {"a": base},
                             tokens_per_chunk=TPC, tolerance=1e-3)
    assert (report.identical, report.max_logprob_delta) == (["a"], 0.0)
    (mismatch,) = compare_outputs({"a": outcome("a")}, {"a": base}, tokens_per_chunk=TPC, tolerance=1e-3).mismatches
    assert (mismatch.position, mismatch.kind) == (1, "logprob")


def test_each_dtypes_tolerance_grows_as_its_mantissa_shrinks_and_passes_its_own_rounding():
    # float32 keeps 23 mantissa bits, float16 10, bfloat16 7 (docs/engine.md, "The output oracle"):
    # a wider rounding error needs a wider tolerance, and each passes a delta of half its own.
    assert 0 < LOGPROB_TOLERANCE["float32"] < LOGPROB_TOLERANCE["float16"] < LOGPROB_TOLERANCE["bfloat16"]
    for dtype, tolerance in LOGPROB_TOLERANCE.items():
        near = outcome("a", logprobs=(-1.0 - tolerance / 2, -2.0, -3.0, -4.0))
        far = outcome("a", logprobs=(-1.0 - 2 * tolerance, -2.0, -3.0, -4.0))
        assert compare_outputs({"a": near}, {"a": outcome("a")}, tokens_per_chunk=TPC,
                               tolerance=tolerance).identical == ["a"], dtype
        assert compare_outputs({"a": far}, {"a": outcome("a")}, tokens_per_chunk=TPC,
                               tolerance=tolerance).mismatches, dtype


def test_only_the_same_request_is_compared():
    child_ours = outcome("c", prompt_len=50)
    child_theirs = outcome("c", prompt_len=51)  # its parent's output differed: another prompt
    report = compare_outputs({"c": child_ours, "d": outcome("d")}, {"c": child_theirs}, tokens_per_chunk=TPC,
                             tolerance=1e-3)
    assert report.compared == 0
    assert set(report.not_compared) == {"c", "d"}


def test_an_aborted_request_is_compared_over_the_tokens_both_runs_produced():
    cut = outcome("a", tokens=(5, 6), logprobs=(-1.0, -2.0), aborted=True)
    assert compare_outputs({"a": cut}, {"a": outcome("a")}, tokens_per_chunk=TPC, tolerance=1e-3).identical == ["a"]
    shorter = outcome("a", tokens=(5, 6, 7), logprobs=(-1.0, -2.0, -3.0))  # not aborted: its length differs
    (mismatch,) = compare_outputs({"a": shorter}, {"a": outcome("a")}, tokens_per_chunk=TPC,
                                  tolerance=1e-3).mismatches
    assert (mismatch.kind, mismatch.position) == ("length", 3)
