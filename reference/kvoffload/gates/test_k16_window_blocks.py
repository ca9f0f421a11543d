"""Catalogue K16 in vLLM's scheduler: a window load that ends inside a window block.

The model is ``mixed-blocks-tiny`` (``kvoffload.core.model``): full attention of 6-token blocks
beside a 4-token sliding window of 4-token blocks, one block per chunk, as vLLM builds groups of
their own block sizes (``vllm/group_blocks.py``). The story is the scheduler's alone: the replay's
worker copies one block size for every group, so the stores a first request would leave are put
in the connector's tier through its own manager, and vLLM's scheduler admits the repeat.
"""

from __future__ import annotations

import traceback

import pytest

from kvoffload.gates.story import TINY, tokens

MIXED = TINY.replace(model="mixed-blocks-tiny")
WINDOW_BLOCK = 4  # the window group's block: the engine's block size
# Prompts over one period of both block grids (their lcm, 12) and a window beyond it.
PROMPTS = range(8, 24)
NEEDS_STOCK_TIER = ("needs vLLM's stock connector's scheduler side: the story puts the first request's stores in "
                    "its CPU manager (the replay's worker copies one block size for every group)")


def admit_over_a_stored_prompt(kv_connector, num_tokens: int) -> tuple[int, str | None]:
    """A fresh scheduler (nothing in the GPU cache) whose tier holds every chunk of both groups
    of a prompt of ``num_tokens``, as a request B with that prompt leaves them; C, that prompt
    again, is admitted. Returns where C's load ends and vLLM's failure, if its scheduler died."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from kvoffload.core.types import ConfigError
    from kvoffload.vllm.build import ConnectorLoad, build_kv_cache_config, build_scheduler, build_vllm_config
    from kvoffload.vllm.group_blocks import scheduler_block_sizes

    load = ConnectorLoad(kv_connector.source, kv_connector.preset, kv_connector.disabled)
    try:
        config = build_vllm_config(MIXED, load.transfer_config(MIXED, "stepped"), 64, load)
        kv_cache_config = build_kv_cache_config(config, MIXED)
        scheduler = build_scheduler(config, kv_cache_config)
    except ConfigError as error:  # the reference: the groups' block sizes differ
        pytest.skip(f"cannot run groups of different block sizes: {error}")
    try:
        inner = getattr(scheduler.connector, "connector_scheduler", None)
        if inner is None or not hasattr(inner, "_req_status"):
            pytest.skip(NEEDS_STOCK_TIER)
        init_none_hash(sha256)
        hasher = get_request_block_hasher(scheduler_block_sizes(config, kv_cache_config)["hash_block_size"], sha256)
        request = Request(request_id="C", prompt_token_ids=list(tokens(1, num_tokens)), pooling_params=None,
                          sampling_params=SamplingParams(max_tokens=2, ignore_eos=True), block_hasher=hasher)
        scheduler.add_request(request)
        status = inner._req_status["C"]
        status.update_offload_keys()
        for group in status.group_states:  # the chunks B stored, as its worker's completion reports them
            inner.manager.prepare_store(list(group.offload_keys), status.req_context)
            inner.manager.complete_store(list(group.offload_keys), status.req_context)
        ends = []
        plain = scheduler.connector.get_num_new_matched_tokens

        def matched(req, num_computed_tokens):
            hit, is_async = plain(req, num_computed_tokens)
            ends.append(num_computed_tokens + (hit or 0))
            return hit, is_async
        scheduler.connector.get_num_new_matched_tokens = matched
        try:
            scheduler.schedule()
        except AssertionError as error:  # vLLM's own assert: the engine core dies with it
            frame = traceback.extract_tb(error.__traceback__)[-1]
            where = "/".join(frame.filename.split("/")[-2:])
            return ends[-1], f"AssertionError at {where}:{frame.lineno} ({frame.name}) {error}".strip()
        return ends[-1], None
    finally:
        scheduler.shutdown()


class TestK16UnalignedSlidingWindowLoad:
    """vLLM #48959 (PR #49052, fixed in 0.27.0). A load's pending window blocks were bounded by
    the window in chunks times blocks per chunk (``update_state_after_alloc``), but a window of W
    tokens ending inside a block spans one block more. With one block size for every group no
    load ends there (the catalogue's former reason); with ``mixed-blocks-tiny`` a hit ends on a
    full-attention chunk: a prompt of 8-11 tokens gets 6 back (its 7th token is recomputed), and
    tokens 3-5, the window the 7th attends to, lie in window blocks 0 and 1, two where vLLM
    0.25-0.26 allowed one: ``AssertionError``, the engine core dead. 0.27 allows one block more.
    The prompts sweep a period of both grids (8-23 tokens): every admission must survive, and
    one load at least must end inside a window block, or the story never reached the bug."""

    def test_every_load_of_a_stored_prompt_is_admitted(self, kv_connector):
        ends, died = [], []
        for num_tokens in PROMPTS:
            end, failure = admit_over_a_stored_prompt(kv_connector, num_tokens)
            ends.append(end)
            if failure is not None:
                died.append(f"{num_tokens} tokens, load ending at {end}: {failure}")
        assert not died, f"{len(died)} admissions crashed vLLM's scheduler: {died[0]}"
        inside = [end for end in ends if end % WINDOW_BLOCK not in (0, WINDOW_BLOCK - 1)]
        assert inside, f"no load ended inside a window block (ends {sorted(set(ends))}): the story missed K16"
