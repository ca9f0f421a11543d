"""Catalogue K15 and K16 in vLLM's scheduler: KV cache groups of different block sizes.

K16's model is ``mixed-blocks-tiny`` (full attention of 6-token blocks beside a 4-token window of
4-token blocks), K15's ``nested-blocks-tiny`` (12-token blocks beside an 8-token window of 4-token
blocks), one block per chunk, as vLLM builds groups of their own block sizes
(``vllm/group_blocks.py``). The stories are the scheduler's alone: the replay's worker copies one
block size for every group, so no store is copied (K15 reads which chunks the connector submits)
and the stores a first request would leave are put in the tier through the connector's own
manager (K16): vLLM's stock connector's (``OffloadingConnectorScheduler``) or the reference's
(``ReferenceConnectorScheduler``), through :class:`Tier`.
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager

import pytest

from kvoffload.gates.story import TINY, tokens

MIXED = TINY.replace(model="mixed-blocks-tiny")
NESTED = TINY.replace(model="nested-blocks-tiny", max_num_batched_tokens=8, prefix_cache_retention_interval=None)
WINDOW_BLOCK = MIXED.block_size  # the window group's block: the engine's block size
# Prompts over one period of both block grids (their lcm, 12) and a window beyond it.
PROMPTS = range(8, 24)
NEEDS_A_KNOWN_TIER = ("needs the scheduler side of vLLM's stock connector or of the reference: the story reads and "
                      "fills its CPU manager, as a finished store would")


class Tier:
    """A connector's scheduler side as the stories use it: a request's keys per group, the
    tier filled with them as a finished store leaves them, and the keys it offers for storing."""

    def __init__(self, scheduler):
        inner = getattr(scheduler.connector, "connector_scheduler", None)
        self.stock = inner if hasattr(inner, "_req_status") else None
        self.reference = getattr(scheduler.connector, "core", None) if self.stock is None else None
        if self.stock is None and not hasattr(self.reference, "_requests"):
            pytest.skip(NEEDS_A_KNOWN_TIER)
        self.manager = (self.stock or self.reference).manager

    def group_keys(self, req_id: str) -> list[list[bytes]]:
        """The request's key lists, one a group, as the connector keeps them (they grow)."""
        if self.stock is not None:
            status = self.stock._req_status[req_id]
            status.update_offload_keys()
            return [group.offload_keys for group in status.group_states]
        state = self.reference._requests[req_id]
        self.reference._refresh_keys(state)
        return [group.offload_keys for group in state.groups]

    def fill(self, req_id: str) -> None:
        """Every chunk of every group stored and complete."""
        for g, keys in enumerate(self.group_keys(req_id)):
            if self.stock is not None:
                context = self.stock._req_status[req_id].req_context
                self.manager.prepare_store(list(keys), context)
                self.manager.complete_store(list(keys), context)
            else:
                self.manager.prepare_store(req_id, list(keys), [(chunk, g) for chunk in range(len(keys))])
                self.manager.complete_store(list(keys))

    def note_stores(self, submitted: set) -> None:
        """Add to ``submitted`` every key the connector offers the manager for storing."""
        plain = self.manager.prepare_store

        def noting(*args):
            submitted.update(args[0] if self.stock is not None else args[1])
            return plain(*args)
        self.manager.prepare_store = noting


@contextmanager
def scheduler_alone(kv_connector, engine):
    """vLLM's scheduler (nothing in its GPU cache) with the connector under test, no worker;
    yields it and the connector's :class:`Tier`, or skips."""
    from kvoffload.core.types import ConfigError
    from kvoffload.vllm.build import ConnectorLoad, build_kv_cache_config, build_scheduler, build_vllm_config

    load = ConnectorLoad(kv_connector.source, kv_connector.preset, kv_connector.disabled)
    try:
        config = build_vllm_config(engine, load.transfer_config(engine, "stepped"), 64, load)
        scheduler = build_scheduler(config, build_kv_cache_config(config, engine))
    except ConfigError as error:  # a connector that refuses groups of different block sizes
        pytest.skip(f"cannot run groups of different block sizes: {error}")
    try:
        yield scheduler, Tier(scheduler)
    finally:
        scheduler.shutdown()


def request(scheduler, num_tokens: int, max_tokens: int = 2):
    """A request of ``num_tokens`` prompt tokens, hashed as ``EngineCore`` hashes it."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from kvoffload.vllm.group_blocks import scheduler_block_sizes

    init_none_hash(sha256)
    sizes = scheduler_block_sizes(scheduler.vllm_config, scheduler.kv_cache_config)
    return Request(request_id="C", prompt_token_ids=list(tokens(1, num_tokens)), pooling_params=None,
                   sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   block_hasher=get_request_block_hasher(sizes["hash_block_size"], sha256))


def admit_over_a_stored_prompt(kv_connector, num_tokens: int) -> tuple[int, str | None]:
    """A fresh scheduler whose tier holds every chunk of both groups of a prompt of
    ``num_tokens``, as a request B with that prompt leaves them; C, that prompt again, is
    admitted. Returns where C's load ends and vLLM's failure, if its scheduler died."""
    from kvoffload.core.types import ConnectorCrash

    with scheduler_alone(kv_connector, MIXED) as (scheduler, tier):
        scheduler.add_request(request(scheduler, num_tokens))
        tier.fill("C")  # the chunks B stored, as its worker's completion reports them
        ends = []
        plain = scheduler.connector.get_num_new_matched_tokens

        def matched(req, num_computed_tokens):
            hit, is_async = plain(req, num_computed_tokens)
            ends.append(num_computed_tokens + (hit or 0))
            return hit, is_async
        scheduler.connector.get_num_new_matched_tokens = matched
        try:
            scheduler.schedule()
        except (AssertionError, ConnectorCrash) as error:  # vLLM's assert, or the reference's model of it:
            frame = traceback.extract_tb(error.__traceback__)[-1]  # the engine core dies with it
            where = "/".join(frame.filename.split("/")[-2:])
            return ends[-1], f"{type(error).__name__} at {where}:{frame.lineno} ({frame.name}) {error}".strip()
        return ends[-1], None


def run_to_finish(scheduler, req_id: str) -> None:
    """Schedule until ``req_id`` finishes, no worker: each step's output samples token 7 for every
    request past its prefill, and the connector reports nothing."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    while req_id in scheduler.requests:
        out = scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = [[] if scheduler.requests[r].is_prefill_chunk else [7] for r in ids]
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
            logprobs=None, prompt_logprobs_dict={}, pooler_output=[], kv_connector_output=KVConnectorOutput()))


def window_chunks_stored_in_prefill(kv_connector, num_tokens: int, step: int | None = None,
                                    max_tokens: int = 2) -> tuple[set[int], int]:
    """The window chunks the connector submits for storing while C (``num_tokens``) is
    prefilled in steps of ``step`` tokens (``NESTED.max_num_batched_tokens`` by default) and
    decodes ``max_tokens``, and C's chunk count."""
    engine = NESTED if step is None else NESTED.replace(max_num_batched_tokens=step)
    with scheduler_alone(kv_connector, engine) as (scheduler, tier):
        scheduler.add_request(request(scheduler, num_tokens, max_tokens))
        keys, submitted = tier.group_keys("C")[1], set()
        tier.note_stores(submitted)
        run_to_finish(scheduler, "C")
        return {i for i, key in enumerate(keys) if key in submitted}, len(keys)


class TestK15SlidingWindowHorizon:
    """vLLM #54362 (fixed in 0.30.0). With nested grids only the window's last chunks before a
    full-attention segment's end, or before the prompt's, can serve a hit (vLLM 0.32
    ``SlidingWindowManager.reachable_block_mask``, ``KVCacheGroup.reachable_block_mask`` here),
    and the connector stores only those. vLLM 0.27-0.29 took each chunked-prefill step's frontier
    for the prompt's end and stored the window chunks before it too. ``nested-blocks-tiny``, dense
    retention: C (40 tokens, prefilled 8 a step) may store window chunks 1, 2, 4, 5, 7, 8 and 9
    (the prompt's tail), never 0, 3 or 6 (the frontiers at 8, 16 and 32)."""

    def test_a_chunked_prefill_stores_only_window_chunks_a_hit_can_read(self, kv_connector):
        stored, chunks = window_chunks_stored_in_prefill(kv_connector, 40)
        window = NESTED.kv_model.groups[1]
        alignment = NESTED.kv_model.groups[0].block_size  # full attention's chunk: one block
        reachable = window.reachable_block_mask(0, chunks, NESTED.block_size, alignment, None, (), chunks)
        unreachable = sorted(i for i in stored if not reachable[i])
        assert stored, "no window chunk was stored: the story never reached K15"
        assert not unreachable, f"window chunks {unreachable} stored that no hit can read (stored {sorted(stored)})"


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
