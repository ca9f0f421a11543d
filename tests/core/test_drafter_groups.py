"""The reference connector's drafter groups (core/drafter.py): which groups an EAGLE/MTP
drafter's, by vLLM release, and what a drafter group's stores leave out while the request
decodes (vLLM 0.32 ``SchedulerOffloadConfig.from_spec``, ``storable_chunks``). K17's lookup is
its gate's (tests/gates/test_k14_k19_hybrid.py)."""

from __future__ import annotations

import dataclasses

import pytest

from kvoffload.core.drafter import drafter_groups
from kvoffload.core.fixes import Fixes, ReleaseRules
from kvoffload.core.model import FULL, GroupKind, KVCacheGroup, model_named
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import Engine
from kvoffload.engine.requests import RequestSpec

QWEN = model_named("qwen3-next").groups
EVERY = ReleaseRules(unflagged_groups_draft=True)


@pytest.mark.parametrize("groups, eagle, rules, drafters", [
    (QWEN, 1, ReleaseRules(), set()),  # 0.30+: none flagged, none a drafter's
    (QWEN, 1, EVERY, {0, 1}),  # 0.25-0.29: every group (vLLM #52735)
    (QWEN, 0, EVERY, set()),  # no EAGLE drafter: no drafter group
    ((FULL, KVCacheGroup(GroupKind.FULL_ATTENTION, drafter=True)), 1, EVERY, {1}),  # a flagged group alone
])
def test_which_groups_are_a_drafters(groups, eagle, rules, drafters):
    assert drafter_groups(groups, eagle, rules) == drafters


@pytest.mark.parametrize("every, step", [(False, 3), (True, 11)])
def test_a_drafter_groups_trailing_chunk_waits_for_the_finish(every, step):
    """B (62 tokens, 10 outputs) under EAGLE: full attention's chunk 3 (tokens 48-63) fills while
    B decodes. Not a drafter's, it is stored then (step 3); a drafter's, its trailing chunk is
    volatile until B finishes (step 11)."""
    config = EngineConfig(model="qwen3-next", block_size=16, gpu_blocks=64, cpu_chunks=64, max_num_seqs=8,
                          max_num_batched_tokens=64, eagle_drafts=1)
    fixes = Fixes(rules=dataclasses.replace(Fixes().rules, unflagged_groups_draft=every))
    record = Engine([RequestSpec("B", tuple(range(1000, 1062)), tuple(range(2000, 2010)))], config, fixes,
                    max_steps=100, trace=True).run()
    stores = {(chunk, group): event["ts"] for event in record.trace_events if event["name"].startswith("store")
              for chunk, group in zip(event["args"]["chunks"], event["args"]["groups"])}
    assert stores[(3, 0)] == step
    assert record.poisoned == [] and record.finished_requests == 1
