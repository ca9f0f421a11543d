"""A gate story that cannot apply to the connector under test skips, and stops what it built: a
connector the gates cannot look inside is known only once vLLM has built it, and both of its
sides (the worker's copy threads and buffers) are shut down before the skip, as after a run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates import story  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402

ONE_REQUEST = [RequestSpec("A", story.tokens(1, 12), story.tokens(2, 2))]


def test_a_story_skipped_after_the_build_shuts_both_sides_down(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    from broken_connector import OpaqueConnector

    monkeypatch.setattr(OpaqueConnector, "shutdowns", [])
    with pytest.raises(pytest.skip.Exception, match="needs the core"):
        story.replay(GateConnector("broken_connector:OpaqueConnector", None), ONE_REQUEST,
                     reference_only="needs the core")
    assert sorted(OpaqueConnector.shutdowns) == ["scheduler", "worker"]

