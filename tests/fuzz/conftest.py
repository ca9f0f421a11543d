"""The engine fuzzer's settings (fuzz_settings.py) and the gates' story helpers, on the path.
Each example is bounded in time (tests/conftest.py), not the whole search."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "gates"))
sys.path.insert(0, str(Path(__file__).parent))

from fuzz_settings import FRESH_SEED, PROFILE  # noqa: E402  (loads the profile)


def pytest_report_header(config):
    return f"fuzz profile: {PROFILE}; fuzz seed: {FRESH_SEED} (KVOFFLOAD_FUZZ_SEED={FRESH_SEED} replays it)"
