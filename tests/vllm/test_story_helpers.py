"""The gate stories' replay helper (kvoffload/gates/story.py): vLLM's GPU prefix cache is
forgotten before exactly the steps a story names (memory pressure from elsewhere), and kept
otherwise, so a gate that means "only the connector can serve this" says so by naming the step."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates import story  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402


def a_shared_prefix_then_a_late_request():
    # A's 16-token prefix (four 4-token blocks of TINY) is done long before B arrives at step 20.
    prefix = story.tokens(1, 16)
    return [RequestSpec("A", prefix + story.tokens(2, 2), story.tokens(3, 2)),
            RequestSpec("B", prefix + story.tokens(4, 2), story.tokens(5, 2), arrival_step=20)]


def test_the_gpu_prefix_cache_is_forgotten_only_before_the_steps_a_story_names():
    kept, built = story.replay(GateConnector("reference", None), a_shared_prefix_then_a_late_request())
    built.close()
    forgotten, built = story.replay(GateConnector("reference", None), a_shared_prefix_then_a_late_request(),
                                    forget_gpu_cache_before=(20,))
    built.close()
    assert (kept.gpu_hit_tokens, kept.connector_hit_tokens_admitted) == (16, 0)
    assert (forgotten.gpu_hit_tokens, forgotten.connector_hit_tokens_admitted) == (0, 16)
