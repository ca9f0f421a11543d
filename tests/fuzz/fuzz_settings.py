"""The fuzzer's hypothesis profiles and this run's fresh seed: one module, imported once (by
conftest.py, which prints the seed, and by the tests, which use it).

- ``ci`` (the default): the derandomized examples (120; the same every run, about a minute on 2
  cores), and beside them ``FRESH_EXAMPLES`` examples from a fresh random seed each run;
  ``KVOFFLOAD_FUZZ_SEED=N`` replays the search of seed N.
- ``nightly`` (``KVOFFLOAD_FUZZ=nightly``): ten times the examples, a fresh random search each run.

Either way a failure prints the shrunk program (``Falsifying example: ...``, a ``Program(...)``
that evaluates as written) and a ``@reproduce_failure`` blob, and the failing example is saved in
hypothesis's example database (``.hypothesis/``), which replays it first on the next run here.
Every failing example is then kept as an explicit story in ``test_fuzz_regressions.py``.
"""

import os
import secrets

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("KVOFFLOAD_FUZZ", "ci")
FRESH_SEED = int(os.environ.get("KVOFFLOAD_FUZZ_SEED") or secrets.randbits(64))
FRESH_EXAMPLES = 40

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               print_blob=True)
settings.register_profile("ci", max_examples=120, derandomize=True, **_COMMON)
settings.register_profile("nightly", max_examples=1200, **_COMMON)
settings.load_profile(PROFILE)
