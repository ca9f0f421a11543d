"""The modelled step time (engine/cost.py, docs/performance.md): a step takes its compute or its
loads, whichever is longer, plus its flushes; KV moves over the host link at the profile's rate.
Each case is computed by hand from the profile's figures."""

from __future__ import annotations

import pytest

from kvoffload.engine.cost import PROFILES, profile


def test_a_step_takes_its_compute_or_its_loads_whichever_is_longer_plus_its_flushes():
    h100 = profile("h100-llama3-8b")
    # 4.8 ms + 1000 prefill tokens x 32 µs + 2 decoding sequences x 80 µs = 36.96 ms of compute;
    # 100 loaded tokens x 128 KiB over 50 GB/s = 0.262144 ms hides under it; the flush of 1000
    # tokens (2.62144 ms) waits for the step
    assert h100.step_seconds(1000, 2, 100, 1000) == pytest.approx(0.03696 + 0.00262144, rel=1e-12)
    # a load of 100,000 tokens (262.144 ms) is longer than the compute: the step waits for it
    assert h100.step_seconds(1000, 2, 100_000, 0) == pytest.approx(0.262144, rel=1e-12)


def test_both_profiles_move_kv_over_the_same_50_gb_per_s_link():
    """The h200 profile differs from the h100's in compute only (HBM3e), not in the host link: a
    step that only loads a million tokens of 128 KiB takes exactly 131,072,000,000 / 50e9 s."""
    assert set(PROFILES) == {"h100-llama3-8b", "h200-llama3-8b"}
    for name in PROFILES:
        assert profile(name).step_seconds(0, 0, 1_000_000, 0) == 2.62144, name
        assert profile(name).step_seconds(0, 0, 0, 1_000_000) == pytest.approx(2.62144 + profile(name).step_overhead_s,
                                                                                rel=1e-12), name
