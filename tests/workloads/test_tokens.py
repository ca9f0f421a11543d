"""Random token ids: ordinary ids of the 32,000-entry vocabulary, never a special id, never past it."""

from __future__ import annotations

import random

from kvoffload.workloads.tokens import FIRST_ORDINARY_ID, VOCAB_SIZE, random_tokens


def test_random_tokens_are_ordinary_ids_spread_over_the_whole_vocabulary():
    # A model's embedding table has VOCAB_SIZE rows: an id past it is an index error in vLLM, a
    # special id (EOS, a role marker) would end an answer or fake a turn.
    ids = random_tokens(random.Random(7), 20_000)
    assert len(ids) == 20_000
    assert FIRST_ORDINARY_ID <= min(ids) and max(ids) < VOCAB_SIZE
    # 20,000 draws over 31,984 ids: both ends of the range are reached within 1 % of it
    assert min(ids) < FIRST_ORDINARY_ID + VOCAB_SIZE // 100 and max(ids) > VOCAB_SIZE - VOCAB_SIZE // 100
