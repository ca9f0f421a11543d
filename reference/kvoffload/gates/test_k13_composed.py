"""Catalogue K13 in vLLM's scheduler: the connector under test beside another one, composed by
vLLM's ``MultiConnector`` (the combination users run for disaggregated prefill plus offload)."""

from __future__ import annotations

import dataclasses

import pytest

from kvoffload.engine.requests import RequestSpec
from kvoffload.gates.story import TINY, assert_clean, replay, tokens

# vLLM's OffloadingConnector returns from update_state_after_alloc before it records a block
# allocated with no external tokens (offloading/scheduler.py, 0.25-0.32): the bug is open.
STOCK_OPEN = "vLLM #46951 (open): the stock connector fences only allocations it loads into itself"


class TestK13MultiConnectorFence:
    """vLLM #46951 / #46865. Sync, 5 usable GPU blocks, MultiConnector[connector under test,
    remote-prefill peer] (``kvoffload.vllm.peer``). A (16 tokens) finishes in step 0; its store of
    chunks 0-3 (blocks 1-4) is built and submitted in step 1. In that schedule remote-B is handed
    block 5 and A's freed block 4 for the peer's load, with zero external tokens for the
    connector under test and no scheduler output of its own; the peer writes B's KV into them
    in step 1. Unless that allocation fences A's store, the store copies B's KV into chunk 3, and
    C (A's prompt + 2) loads it: poisoned."""

    def test_a_block_another_connector_loads_into_is_fenced(self, kv_connector, request):
        if "stock" in kv_connector.source.split("+"):
            request.applymarker(pytest.mark.xfail(strict=True, reason=STOCK_OPEN))
        composed = dataclasses.replace(kv_connector, source=f"{kv_connector.source}+peer")
        a = RequestSpec("A", tokens(1, 16), tokens(2, 1))
        b = RequestSpec("remote-B", tokens(9, 12), tokens(10, 2), arrival_step=1)
        c = RequestSpec("C", a.prompt_token_ids + tokens(77, 2), tokens(78, 2), arrival_step=8)
        record, _ = replay(composed, [a, b, c], TINY.replace(gpu_blocks=6))
        assert_clean(record, finished=3)
        assert record.connector_hit_tokens_admitted >= 8  # remote-B's 8 from the peer: the story ran
