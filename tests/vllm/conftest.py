"""Helpers of the vllm-marked tests. Each test module skips itself when vLLM is absent
(``pytest.importorskip``), so the main suite runs without the vllm extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the folder's helpers (hybrid_gate.py), as tests/gates does


@pytest.fixture(scope="session")
def small_workload():
    from kvoffload.workloads import load_workload

    cache = {}

    def load(name: str, **overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in cache:
            cache[key] = load_workload(name, {k: str(v) for k, v in overrides.items()})
        return cache[key]

    return load
