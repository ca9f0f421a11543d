"""Hypothesis profiles for the engine fuzzer: ``ci`` (the default: derandomized, so CI explores
the same examples every run; about a minute on 2 cores) and ``nightly`` (ten times the examples,
a fresh random search each run): ``KVOFFLOAD_FUZZ=nightly``. The gates' story helpers are shared."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parents[1] / "gates"))
sys.path.insert(0, str(Path(__file__).parent))

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               print_blob=True)
settings.register_profile("ci", max_examples=120, derandomize=True, **_COMMON)
settings.register_profile("nightly", max_examples=1200, **_COMMON)
settings.load_profile(os.environ.get("KVOFFLOAD_FUZZ", "ci"))
