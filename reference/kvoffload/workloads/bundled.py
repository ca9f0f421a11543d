"""The bundled workloads (``workloads/*.toml``), the one list: ``kvoffload bench`` and the gate
take them all, ``kvoffload releases`` and the asv suite those without scripted resets.

Each comes in a full size and a ``-small`` one. A hybrid workload is a dense one replayed on a
hybrid model (core/model.py): the same definition with ``[engine] model`` set, so its requests
are its twin's, request for request.
"""

from __future__ import annotations

# the dense workloads a real model (--engine vllm) replays too, and the release table holds
DENSE_WORKLOADS = ("shared-prefix", "multi-turn", "spec-decode")
# scripted cache resets (vllm/llm_engine.py refuses them): kvoffload bench and the gate only
RESET_WORKLOADS = ("aborts-and-resets",)
# hybrid workload -> the dense workload whose requests it replays
HYBRID_TWINS = {
    "gpt-oss-multi-turn": "multi-turn",
    "gpt-oss-spec-decode": "spec-decode",
    "qwen3-next-multi-turn": "multi-turn",
    "qwen3-next-spec-decode": "spec-decode",
}
HYBRID_WORKLOADS = tuple(HYBRID_TWINS)
BUNDLED_WORKLOADS = DENSE_WORKLOADS + RESET_WORKLOADS + HYBRID_WORKLOADS


def small(name: str) -> str:
    """The test-size version of a bundled workload."""
    return f"{name}-small"
