"""K16's admission story reports where C's load ends: the tokens vLLM computed before the lookup
plus the connector's hit. A connector that serves nothing gives no hit, so C's load ends where
its computed tokens end (none: nothing is in vLLM's GPU cache), not a token past it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.gates.plugin import GateConnector  # noqa: E402
from kvoffload.gates.test_k15_k16_block_sizes import admit_over_a_stored_prompt  # noqa: E402


def test_a_connector_that_serves_nothing_admits_c_with_a_load_ending_at_0(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # broken_connector.py, loaded by module path
    end, failure = admit_over_a_stored_prompt(GateConnector("broken_connector:NeverServesConnector", None), 8)
    assert (end, failure) == (0, None)
