"""K17 with a drafter group of its own: ``qwen3-next-mtp`` (full attention, Mamba, and an MTP
drafter's full-attention group flagged ``is_eagle_group``) under an EAGLE drafter of one token
(``eagle_drafts``), block size 16, one block per chunk, prefills of 16 tokens and dense
retention, so B stores a Mamba state at every chunk.

The drafter's KV at position ``i`` is that of the prefix through token ``i + 1``
(engine/drafter_kv.py, ``set_inputs_first_pass``). C shares B's first ``n`` tokens and differs at
token ``n``: a drafter chunk of B ending at ``n`` holds B's token ``n`` in its last slot. vLLM
0.30+'s connector looks a drafter group up one chunk further and drops the last chunk it found
(``_lookup_complete_chunks``, core/drafter.py), so C's hit stops a chunk short of ``n``; a
connector that looks the drafter group up like a target group loads that chunk: one poisoned
drafter slot (docs/hybrid.md, "Gates")."""

from __future__ import annotations

import pytest
from planted import StoredDrafterTailScheduler, UndroppedDrafterLookupScheduler
from story import SCHEDULINGS, TINY, assert_healthy, engine, poisoned, tokens

from kvoffload.engine import drafter_kv, oracle
from kvoffload.engine.requests import RequestSpec

CONFIG = TINY.replace(model="qwen3-next-mtp", block_size=16, gpu_blocks=64, eagle_drafts=1,
                      prefix_cache_retention_interval=None, max_num_batched_tokens=16)
P = tuple(range(1000, 1064))


def requests(shared: int) -> list[RequestSpec]:
    """B (P + 6, 4 outputs); C (68 tokens, B's first ``shared``) at step 12, after the GPU cache
    forgot B."""
    return [RequestSpec("B", P + tuple(range(5000, 5006)), tokens(2, 4)),
            RequestSpec("C", P[:shared] + tuple(range(7000, 7068 - shared)), tokens(3, 4), arrival_step=12)]


def replay(scheduling: str, shared: int, connector_class=None):
    config = CONFIG.replace(scheduling=scheduling)
    eng = engine(requests(shared), config, forget_gpu_cache_before=(12,))
    if connector_class is not None:
        eng.connector = eng.scheduler.connector = connector_class(config.connector_config(), eng.fixes)
    return eng.run()


@pytest.mark.parametrize("scheduling", SCHEDULINGS)
@pytest.mark.parametrize("shared, served", [(32, 16), (64, 48)])
def test_the_reference_stops_a_chunk_short_of_the_divergence(scheduling, shared, served):
    record = replay(scheduling, shared)
    assert_healthy(record)
    assert record.finished_requests == 2
    assert record.connector_hit_tokens_admitted == served


@pytest.mark.parametrize("scheduling", SCHEDULINGS)
@pytest.mark.parametrize("shared, chunk", [(32, 1), (64, 3)])
def test_a_drafter_group_looked_up_like_a_target_group_loads_a_poisoned_slot(scheduling, shared, chunk):
    """The drop removed: C is served up to its divergence; the chunk ending there holds B's next
    token in its last drafter slot, one bad slot in group 2."""
    record = replay(scheduling, shared, UndroppedDrafterLookupScheduler)
    assert record.connector_hit_tokens_admitted == shared
    assert poisoned(record) == [("C", chunk, 1)] and record.poisoned[0].group == 2


@pytest.mark.parametrize("scheduling", SCHEDULINGS)
def test_without_the_drop_a_divergence_past_the_chunk_end_stays_clean(scheduling):
    """C shares token 32 too: the chunk ending at 32 names C's own token 32, served clean (the
    drop guards only a divergence on a chunk's end)."""
    record = replay(scheduling, 33, UndroppedDrafterLookupScheduler)
    assert_healthy(record)
    assert record.connector_hit_tokens_admitted == 32


@pytest.mark.parametrize("scheduling", SCHEDULINGS)
def test_stores_of_the_trailing_drafter_chunk_load_clean(scheduling):
    """The reference with core/drafter.py's store exclusion removed (stores of a drafter group's
    trailing chunk while decoding): with no drafts proposed every drafter slot a store reads was
    written in its step with the script's next token, and the lookup's drop still guards the
    divergence, so C loads clean, served as by the reference."""
    record = replay(scheduling, 32, StoredDrafterTailScheduler)
    assert_healthy(record)
    assert record.connector_hit_tokens_admitted == 16


def test_the_oracle_catches_it_by_the_drafters_lead(monkeypatch):
    """With the drafter's slots written and checked as a target group's (no lead), the same
    planted connector loads clean: the lead is what names B's token in C's chunk."""
    monkeypatch.setattr(drafter_kv, "DRAFTER_LEAD", 0)
    monkeypatch.setattr(oracle, "DRAFTER_LEAD", 0)
    record = replay("sync", 32, UndroppedDrafterLookupScheduler)
    assert record.connector_hit_tokens_admitted == 32
    assert poisoned(record) == []
