"""bench_real_model: its tracks read the cached metrics in lower-is-better form; without vLLM
every benchmark is skipped (NotImplementedError), as asv records it on the CPU machine."""

from __future__ import annotations

import importlib.util
import math

import pytest


def test_tracks_are_lower_is_better_forms_of_the_measured_metrics(suite, methods_of):
    module = suite("bench_real_model")
    assert methods_of(module.RealModel) == ["track_seconds_per_output_token", "track_tpot_ms_p50",
                                            "track_ttft_ms_p50", "track_ttft_ms_p99"]
    cache = {"reference": {"output_tokens_per_s": 200.0, "ttft_ms_p50": 12.5, "ttft_ms_p99": 40.0,
                           "tpot_ms_p50": 4.0},
             "off": {"output_tokens_per_s": None}}
    bench = module.RealModel()
    bench.setup(cache, "reference")
    assert bench.track_seconds_per_output_token(cache, "reference") == 1 / 200.0
    assert (bench.track_ttft_ms_p50(cache, "reference"), bench.track_ttft_ms_p99(cache, "reference"),
            bench.track_tpot_ms_p50(cache, "reference")) == (12.5, 40.0, 4.0)
    bench.setup(cache, "off")
    assert math.isnan(bench.track_seconds_per_output_token(cache, "off"))  # no rate: n/a


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_benchmarks_are_skipped(suite):
    module = suite("bench_real_model")
    assert module.RealModel().setup_cache() is None
    with pytest.raises(NotImplementedError):
        module.RealModel().setup(None, "reference")
    with pytest.raises(NotImplementedError):
        module.RealModelReplay().setup()


def test_the_given_models_tracks_are_the_same_forms_under_the_models_name(suite, methods_of):
    """scripts/gpu-runner --model DIR: RealModelGiven tracks DIR's model beside the tiny model's
    line (the model's folder name a parameter); without one it is skipped."""
    module = suite("bench_real_model")
    assert methods_of(module.RealModelGiven) == methods_of(module.RealModel)
    assert module.RealModelGiven.param_names == ["model", "connector"]
    if not module.GIVEN_MODEL:
        assert module.RealModelGiven.params[0] == ["none"] and module.RealModelGiven().setup_cache() is None
        with pytest.raises(NotImplementedError):
            module.RealModelGiven().setup(None, "none", "reference")
    cache = {"reference": {"output_tokens_per_s": 50.0, "ttft_ms_p50": 2.0, "ttft_ms_p99": 9.0, "tpot_ms_p50": 1.5}}
    bench = module.RealModelGiven()
    bench.setup(cache, "Llama-3.1-8B", "reference")
    assert bench.track_seconds_per_output_token(cache, "Llama-3.1-8B", "reference") == 1 / 50.0
    assert (bench.track_ttft_ms_p50(cache, "m", "reference"), bench.track_ttft_ms_p99(cache, "m", "reference"),
            bench.track_tpot_ms_p50(cache, "m", "reference")) == (2.0, 9.0, 1.5)
