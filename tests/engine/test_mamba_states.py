"""The KV oracle's Mamba states (engine/oracle.py; docs/engine.md, "The KV oracle"). A Mamba
group's block holds one state, not one value per position: in every slot the salted fingerprint
of the prefix the state summarises and, in the slot's second word, that prefix's token count.
Every load on the model is checked at the state its request resumes from.

The story is K18's (tests/gates/test_k14_k19_hybrid.py): ``qwen3-next`` at block size 16, one
block per chunk. B (P = 64 tokens, + 6) stores the state at 64; after the GPU cache forgot it, C
(P + 4) is served 64 tokens, four full-attention chunks and that state.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from story import TINY, engine, poisoned, tokens

from kvoffload.core.hybrid import HybridConnectorScheduler
from kvoffload.core.keys import group_key
from kvoffload.core.types import StepPlan
from kvoffload.engine.oracle import group_salt, prefix_fingerprints
from kvoffload.engine.requests import RequestSpec

MAMBA = 1  # qwen3-next's Mamba group
P = tuple(range(1000, 1064))


def story(c_prompt=P + (7000, 7001, 7002, 7003), connector_class=None, before_c=None, **settings):
    """B, then C at step 12 after the GPU cache forgot B; ``before_c(eng)`` runs at step 12."""
    config = TINY.replace(model="qwen3-next", block_size=16, gpu_blocks=64, **settings)
    requests = [RequestSpec("B", P + tuple(range(5000, 5006)), tokens(2, 4)),
                RequestSpec("C", c_prompt, tokens(3, 4), arrival_step=12)]
    eng = engine(requests, config, forget_gpu_cache_before=(12,))
    if connector_class is not None:
        eng.connector = eng.scheduler.connector = connector_class(config.connector_config(), eng.fixes)
    if before_c is not None:
        forget = eng.on_step

        def on_step(next_step: int, finished: int) -> None:
            forget(next_step, finished)
            if next_step == 12:
                before_c(eng)
        eng.on_step = on_step
    return eng, eng.run()


def words(cache: torch.Tensor, slot_bytes: int) -> np.ndarray:
    """A KV tensor's slots as int64 words: [slots, words per slot]."""
    return cache.reshape(-1).view(torch.int64).numpy().reshape(-1, slot_bytes // 8)


def state_of_64() -> int:
    """The salted fingerprint of P, what the state at 64 summarises."""
    fingerprints = prefix_fingerprints(np.asarray(P, dtype=np.int64)).view(np.int64)
    return int(fingerprints[63] ^ np.int64(group_salt(MAMBA)))


def test_a_state_block_holds_the_fingerprint_and_count_of_the_prefix_it_summarises():
    """B's chunk ending at 64 leaves the state at 64 in its row's block 3, which the connector
    stores: all 16 slots of the tier's copy hold P's fingerprint (salted) and the count 64, none
    a position's. (C here shares nothing with B.)"""
    eng, _ = story(c_prompt=tokens(9, 8))
    held = words(eng.kv.cpu, eng.config.slot_bytes)
    rows = held[held[:, 0] == state_of_64()]
    assert len(rows) == 16 and (rows[:, 1] == 64).all()


def test_the_right_state_loads_clean():
    _, record = story()
    assert record.connector_hit_tokens_admitted == 64 and record.poisoned == [] and record.finished_requests == 2


@pytest.mark.parametrize("word, value", [(1, 63), (0, "the state of 63")])
def test_a_stored_state_with_another_count_or_prefix_is_poisoned(word, value):
    """The tier's copy of the state at 64 is altered before C loads it: its count made 63 (the
    prefix's fingerprint still right), or its fingerprint made that of 63 tokens (the count still
    64). Either is a state C does not resume from: one poisoned slot, group 1, chunk 3."""
    fingerprints = prefix_fingerprints(np.asarray(P, dtype=np.int64)).view(np.int64)
    new = value if word == 1 else int(fingerprints[62] ^ np.int64(group_salt(MAMBA)))

    def alter(eng) -> None:
        held = words(eng.kv.cpu, eng.config.slot_bytes)
        rows = held[:, 0] == state_of_64()
        assert rows.sum() == 16  # the one stored state, every slot of it
        held[rows, word] = new

    _, record = story(before_c=alter)
    assert record.connector_hit_tokens_admitted == 64
    assert poisoned(record) == [("C", 3, 1)] and record.poisoned[0].group == MAMBA


class WholeRequestHitScheduler(HybridConnectorScheduler):
    """A Mamba hit bounded by the whole request: an exact resend is served all of it."""

    def _lookup_bound(self, req) -> int:
        return req.num_tokens


def test_a_whole_request_hit_resumes_one_token_before_its_state():
    """C = P exactly, served all 64 tokens with the state of 64: the engine still recomputes the
    last token (the request resumes after 63), and the state of 64 is one token late."""
    _, record = story(c_prompt=P, connector_class=WholeRequestHitScheduler)
    assert record.connector_hit_tokens_admitted == 64
    assert poisoned(record) == [("C", 3, 1)] and record.poisoned[0].group == MAMBA


class StatelessLoadScheduler(HybridConnectorScheduler):
    """A load that carries full attention's chunks and leaves the Mamba state out."""

    def build_connector_meta(self, out) -> StepPlan:
        plan = super().build_connector_meta(out)
        jobs = []
        for job in plan.load_jobs:
            keep = [i for i, group in enumerate(job.chunk_groups) if group != MAMBA]
            jobs.append(job._replace(gpu_block_ids=tuple(job.gpu_block_ids[i] for i in keep),
                                     chunk_slots=tuple(job.chunk_slots[i] for i in keep),
                                     chunk_indices=tuple(job.chunk_indices[i] for i in keep),
                                     chunk_groups=tuple(job.chunk_groups[i] for i in keep),
                                     chunk_skips=tuple(job.chunk_skips[i] for i in keep)))
        return dataclasses.replace(plan, load_jobs=tuple(jobs))


def test_a_load_without_the_state_is_checked_at_the_state_it_left_out():
    """The check reads the request's row at its resume point whichever chunks the load carried:
    C's block 3 in the Mamba group was never written by a load or a forward of C's."""
    _, record = story(connector_class=StatelessLoadScheduler)
    assert record.connector_hit_tokens_admitted == 64
    assert poisoned(record) == [("C", 3, 1)] and record.poisoned[0].group == MAMBA


def test_with_one_word_per_slot_the_fingerprint_alone_names_the_count():
    """slot_bytes = 8 leaves no word for the count: the fingerprint of exactly n tokens still
    tells a state one token late (K18's plant: C = P served 63 tokens with the state of 64)."""
    from planted import UnroundedMambaHitScheduler

    _, record = story(c_prompt=P, connector_class=UnroundedMambaHitScheduler, slot_bytes=8)
    assert record.connector_hit_tokens_admitted == 63
    assert poisoned(record) == [("C", 3, 1)] and record.poisoned[0].group == MAMBA
