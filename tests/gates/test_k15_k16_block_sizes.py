"""Catalogue K15 and K16 in the simulator: KV cache groups of different block sizes
(docs/engine.md, "Groups with block sizes of their own"; engine/block_grids.py).

K16's model is ``mixed-blocks-tiny`` (full attention of 6-token blocks beside a 4-token window of
the engine's 4-token blocks), K15's ``nested-blocks-tiny`` (12-token blocks beside an 8-token
window of 4-token blocks); one block per chunk, each group chunked at its own block size. The
stories are those of vLLM's scheduler (``kvoffload/gates/test_k15_k16_block_sizes.py``), here with
the worker copying every group's blocks and the KV oracle checking every slot a load fills.
"""

from __future__ import annotations

import pytest
from story import SCHEDULINGS, TINY, assert_healthy, engine, poisoned, tokens

from kvoffload.core.fixes import Fixes
from kvoffload.engine.requests import RequestSpec

MIXED = TINY.replace(model="mixed-blocks-tiny", prefix_cache_retention_interval=None)
NESTED = TINY.replace(model="nested-blocks-tiny", max_num_batched_tokens=8, prefix_cache_retention_interval=None)
PROMPTS = range(8, 24)  # a period of both grids (their lcm, 12) and a window beyond it


def chunks_stored(record, req_id: str, group: int) -> set[int]:
    """``group``'s chunks of ``req_id`` that a store job carried (the run's trace)."""
    return {chunk for event in record.trace_events if event["name"].startswith("store") and event["tid"] == req_id
            for chunk, g in zip(event["args"]["chunks"], event["args"]["groups"]) if g == group}


def chunks_loaded(record, req_id: str) -> list[tuple[int, int]]:
    """(chunk, group) of every chunk a load of ``req_id`` carried."""
    return [pair for event in record.trace_events if event["name"].startswith("load") and event["tid"] == req_id
            for pair in zip(event["args"]["chunks"], event["args"]["groups"])]


class TestK16UnalignedSlidingWindowLoad:
    """vLLM #48959 (PR #49052, fixed in 0.27.0). A prompt P of 8-23 tokens is stored by A (P's
    first 4 tokens: window chunk 0, the tail of its prompt) and B (P: every full-attention chunk,
    the window's reachable ones); the GPU cache forgets them and C = P is admitted over the tier.
    A load of 8-11 tokens ends at 6 (a full-attention chunk), and the window the 7th token reads,
    tokens 3-5, spans window blocks 0 and 1: two pending blocks where vLLM 0.25-0.26 allowed one
    (``update_state_after_alloc``'s assert, the engine core dead), 0.27+ one more. Every admission
    must survive with a clean load, and one load at least end inside a window block."""

    def replay(self, num_tokens: int, scheduling: str, fixes: Fixes | None = None):
        prompt = tokens(1, num_tokens)
        requests = [RequestSpec("A", prompt[:4], tokens(2, 1)),
                    RequestSpec("B", prompt, tokens(3, 1), arrival_step=4),
                    RequestSpec("C", prompt, tokens(4, 2), arrival_step=20)]
        return engine(requests, MIXED.replace(scheduling=scheduling), fixes, forget_gpu_cache_before=(20,)).run()

    def admissions(self, scheduling: str, fixes: Fixes | None = None) -> tuple[dict[int, int], list[str], dict]:
        """Per prompt length, where C's load ends; every failed replay; and the crashes."""
        ends, failures, crashes = {}, [], {}
        for num_tokens in PROMPTS:
            record = self.replay(num_tokens, scheduling, fixes)
            ends[num_tokens] = record.connector_hit_tokens_admitted
            found = record.problems(fences=True, lifecycle=True, invariants=True)
            if found or record.finished_requests != 3:
                failures.append(f"{num_tokens} tokens: {'; '.join(found) or 'C never finished'}")
            if record.crash is not None:
                crashes[num_tokens] = record.crash
        return ends, failures, crashes

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_every_load_of_a_stored_prompt_is_admitted(self, scheduling):
        ends, failures, _ = self.admissions(scheduling)
        assert not failures, f"{len(failures)} of {len(ends)} replays failed: {failures[0]}"
        inside = [end for end in ends.values() if end % MIXED.block_size not in (0, MIXED.block_size - 1)]
        assert inside, f"no load ended inside a window block (ends {sorted(set(ends.values()))}): the story missed K16"

    def test_the_loads_end_where_vllm_0_32s_connector_ends_them(self):
        """The reference in vLLM 0.32.0's scheduler (tests/vllm/test_k15_k16_block_sizes.py): 6
        for 8-11 tokens, 11 for 12, 12 for 13-17, 16 for 18-19, 18 for 20-23; the oracle found
        every loaded slot of both groups right (the previous test)."""
        ends, _, _ = self.admissions("sync")
        expected = {n: 6 if n < 12 else 11 if n == 12 else 12 if n < 18 else 16 if n < 20 else 18 for n in PROMPTS}
        assert ends == expected

    @pytest.mark.parametrize("preset", ("vllm-0.25", "vllm-0.26"))
    def test_0_25_and_0_26_die_at_the_loads_ending_inside_a_window_block(self, preset):
        """Their bound, the window in blocks (``ReleaseRules.window_load_spare_block`` off):
        the loads ending at 6 (8-11 tokens) and 18 (20-23) crash, 8 of 16, as in 0.25.0's and
        0.26.0's schedulers. (``vllm-0.26`` also reports lifecycle violations, its own preset's.)"""
        _, _, crashes = self.admissions("sync", Fixes.preset(preset))
        assert sorted(crashes) == [8, 9, 10, 11, 20, 21, 22, 23]
        assert all("num_pending_gpu_blocks <= window" in crash for crash in crashes.values())

    def test_0_29_passes(self):
        _, failures, _ = self.admissions("sync", Fixes.preset("vllm-0.29"))
        assert not failures


class TestK15SlidingWindowHorizon:
    """vLLM #54362 (fixed in 0.30.0). ``nested-blocks-tiny``, dense retention: C (40 tokens,
    prefilled 8 a step) may store window chunks 1, 2, 4, 5, 7, 8 and 9 (each 12-token segment's
    last two and the prompt's tail, ``KVCacheGroup.reachable_block_mask``), never 0, 3 or 6 (the
    frontiers at 8, 16 and 32 taken for the prompt's end, as 0.27-0.29 did). D (C's prompt + 4,
    after the GPU cache forgot C) loads 36 tokens: the window chunks before 36, 7 and 8."""

    def replay(self, scheduling: str, fixes: Fixes | None = None):
        requests = [RequestSpec("C", tokens(1, 40), tokens(2, 2)),
                    RequestSpec("D", tokens(1, 40) + tokens(5, 4), tokens(6, 2), arrival_step=30)]
        return engine(requests, NESTED.replace(scheduling=scheduling), fixes, forget_gpu_cache_before=(30,)).run()

    @staticmethod
    def unreachable(stored: set[int], num_chunks: int) -> list[int]:
        window, alignment = NESTED.kv_model.groups[1], NESTED.kv_model.groups[0].block_size
        reachable = window.reachable_block_mask(0, num_chunks, NESTED.block_size, alignment, None, (), num_chunks)
        return sorted(i for i in stored if not reachable[i])

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_a_chunked_prefill_stores_only_window_chunks_a_hit_can_read(self, scheduling):
        record = self.replay(scheduling)
        assert_healthy(record)
        stored = chunks_stored(record, "C", 1)
        assert stored, "no window chunk was stored: the story never reached K15"
        assert not self.unreachable(stored, 10), f"window chunks stored that no hit can read: {sorted(stored)}"
        assert stored == {1, 2, 4, 5, 7, 8, 9}
        assert record.connector_hit_tokens_admitted == 36 and chunks_loaded(record, "D") == [
            (0, 0), (1, 0), (2, 0), (7, 1), (8, 1)]

    @pytest.mark.parametrize("scheduling", SCHEDULINGS)
    def test_0_29_stores_the_frontiers_unreachable_chunks_and_nothing_loads_them(self, scheduling):
        """``vllm-0.29`` (``WindowRules.FRONTIER_TAILS``) stores chunks 0, 3 and 6 too: the gate's
        failure. They hold C's KV (no poisoned load) and no hit reads them: D loads the same
        chunks as with the reference, the tier slots are wasted."""
        record = self.replay(scheduling, Fixes.preset("vllm-0.29"))
        assert chunks_stored(record, "C", 1) == set(range(10))
        assert self.unreachable(chunks_stored(record, "C", 1), 10) == [0, 3, 6]
        assert not poisoned(record) and record.crash is None
        assert chunks_loaded(record, "D") == [(0, 0), (1, 0), (2, 0), (7, 1), (8, 1)]

    @pytest.mark.parametrize("preset", ("vllm-0.25", "vllm-0.26"))
    def test_0_25_and_0_26_store_the_segments_tails_only(self, preset):
        """``WindowRules.SEGMENT_TAILS``: not the prompt's tail (chunk 9), no gate failure."""
        record = self.replay("sync", Fixes.preset(preset))
        assert_healthy(record)
        assert chunks_stored(record, "C", 1) == {1, 2, 4, 5, 7, 8}
