"""The smallest replays of a request re-admitted after preemption before the connector offered
the chunk it filled last: the simulator's story (test_replayed_rules.py) and the differential
against vLLM's scheduler (tests/vllm/test_differential.py) replay the same.

A and B (8-token prompts, 6 outputs each; block size 4, one block per chunk) decode until B
cannot grow and is preempted; its chunk 2 (positions 8-11) is full but not yet offered. Re-admitted,
B gets its blocks back anew, so the store of chunk 2 counts from the step that hands them back and
plans it, as vLLM's scheduler counts a block handed to a request
(``kvoffload.vllm.observe.StoreSubmitDelays``). Counting from B's write before the preemption gave
3 and 4 steps, where vLLM's scheduler gives 1 (docs/fidelity.md, "Store submission delays").
"""

from __future__ import annotations

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec
from story import TINY, tokens

READMITTED = {
    # Sync, one draft accepted per step, 6 usable blocks: step 2's accepted draft fills chunk 2
    # (the connector offers it once the token is known, at step 3); B is preempted at step 3,
    # re-admitted at step 4 on a GPU hit of 8 tokens, recomputes chunk 2 there, and its store is
    # submitted at step 5: 1 step (3 from the write at step 2).
    "sync, recomputed": TINY.replace(gpu_blocks=7, reserve_full_isl=False, spec_tokens=1),
    # Async, 7 usable blocks: step 4 fills chunk 2 (async offers a decode's chunk a step later);
    # B cannot grow at step 5, is preempted at step 6, re-admitted at step 7 on its own three
    # blocks (a GPU prefix-cache hit), and its store is submitted at step 8: 1 step (4 from step 4).
    "async, GPU prefix-cache hit": TINY.replace(gpu_blocks=8, reserve_full_isl=False, scheduling="async"),
}


def readmitted_requests(config: EngineConfig) -> list[RequestSpec]:
    accept = {"accept_counts": (1,)} if config.spec_tokens else {}
    return [RequestSpec("A", tokens(1, 8), tokens(2, 6), **accept),
            RequestSpec("B", tokens(3, 8), tokens(4, 6), **accept)]
