"""The gate's stories replay the -small workloads; the instruction count (valgrind, half a minute
a call) is played by a stand-in unless a story counts for real (``real_counts``)."""

from __future__ import annotations

import pytest

from kvoffload import gate_counts


@pytest.fixture(autouse=True)
def no_callgrind(request, monkeypatch):
    if "real_counts" not in request.fixturenames:
        monkeypatch.setattr(gate_counts, "collect", lambda: {})


@pytest.fixture
def real_counts():
    """The story counts instructions under valgrind for real."""
