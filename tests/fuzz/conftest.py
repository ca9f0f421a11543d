"""Hypothesis profiles for the engine fuzzer: ``ci`` (default, about a minute on 2 cores) and
``nightly`` (ten times the examples): ``KVOFFLOAD_FUZZ=nightly``."""

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               derandomize=False, print_blob=True)
settings.register_profile("ci", max_examples=150, **_COMMON)
settings.register_profile("nightly", max_examples=1500, **_COMMON)
settings.load_profile(os.environ.get("KVOFFLOAD_FUZZ", "ci"))
