"""The reference connector for a hybrid model (core/hybrid.py, core/hybrid_stores.py): vLLM 0.32's
per-group rules, one story each (docs/engine.md, "Hybrid models").

Full attention (group 0) and an 8-token sliding window (group 1), block size 4, one block per
chunk: the window's lookup needs cdiv(8, 4) = 2 chunks in a row; a window hit ending at token n
needs its blocks from token n - 7 on. The test plays the engine: it hands each request its
per-group block tables.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import PRESETS, Fixes
from kvoffload.core.hybrid import HybridConnectorScheduler, connector_scheduler, group_key
from kvoffload.core.request import Request
from kvoffload.core.types import ConnectorConfig, RequestStatus, SchedulerOutput, TransferResult, cdiv

EOS = 50256
class Groups:
    """A scripted engine for a two-group model."""

    def __init__(self, retention: int | None = 0, cpu_chunks: int = 32, fixes: Fixes | None = None,
                 model: str = "gpt-oss-tiny"):
        self.config = ConnectorConfig(block_size=4, blocks_per_chunk=1, cpu_chunks=cpu_chunks, model=model,
                                      prefix_cache_retention_interval=retention)
        self.connector = connector_scheduler(self.config, fixes or Fixes())
        self.requests: dict[str, Request] = {}
        self.stored: dict[tuple[str, int], set[int]] = {}  # (request, group) -> chunks stored
        self.step_index = 0

    def add(self, req_id: str, prompt) -> Request:
        req = self.requests[req_id] = Request(req_id, prompt, 4)
        self.connector.on_new_request(req)
        return req

    def step(self, scheduled=None, new_blocks=None, finished=()):
        out = SchedulerOutput(self.step_index, dict(scheduled or {}),
                              {r: tuple(tuple(g) for g in groups) for r, groups in (new_blocks or {}).items()},
                              tuple(finished))
        plan = self.connector.build_connector_meta(out)
        for req_id, n in (scheduled or {}).items():
            self.requests[req_id].num_computed_tokens += n
            self.requests[req_id].status = RequestStatus.RUNNING
        for job in plan.store_jobs:
            for chunk, group in zip(job.chunk_indices, job.chunk_groups):
                self.stored.setdefault((job.req_id, group), set()).add(chunk)
        self.connector.update_connector_output([TransferResult(job.job_id) for job in plan.store_jobs])
        self.connector.check_invariants()
        self.step_index += 1
        return plan

    def prefill_and_finish(self, req_id: str, prompt, first_block: int) -> None:
        """``req_id`` prefills ``prompt`` in one step (every group a fresh table), its stores land, it finishes."""
        req = self.add(req_id, prompt)
        self.connector.get_num_new_matched_tokens(req, 0)
        count = len(prompt) // 4
        tables = [list(range(first_block, first_block + count)), list(range(first_block + count, first_block + 2 * count))]
        self.step({req_id: len(prompt)}, {req_id: tables})
        req.append_tokens([EOS])
        req.status = RequestStatus.FINISHED_STOPPED
        self.connector.request_finished(req, tuple(tuple(t) for t in tables))
        self.step(finished=[req_id])


def prompt(n: int, seed: int = 1) -> list[int]:
    return [(seed * 7919 + i * 104729) % 30000 + 3 for i in range(n)]


def test_every_group_keys_its_chunks_in_its_own_namespace():
    """make_offload_key(hash, group): the same chunk has one key per group."""
    groups = Groups()
    req = groups.add("A", prompt(8))
    state = groups.connector._requests["A"]
    assert len(state.groups[0].offload_keys) == len(state.groups[1].offload_keys) == 2
    assert state.groups[0].offload_keys[0] == req.block_hashes[0]
    assert state.groups[1].offload_keys[0] != state.groups[0].offload_keys[0]


def test_groups_of_their_own_block_sizes_key_a_chunk_at_its_own_end():
    """``mixed-blocks-tiny`` (6-token blocks beside the engine's 4): the request is hashed every
    gcd, 2 tokens; a group's chunk i is keyed by the hash ending where it ends (vLLM 0.32
    ``hashes_per_chunk``), 3 hashes apart in group 0, 2 in group 1."""
    config = ConnectorConfig(block_size=4, blocks_per_chunk=1, cpu_chunks=8, model="mixed-blocks-tiny")
    connector = connector_scheduler(config, Fixes())
    req = Request("A", prompt(12), 2)
    connector.on_new_request(req)
    groups = connector._requests["A"].groups
    assert groups[0].offload_keys == [req.block_hashes[2], req.block_hashes[5]]
    assert groups[1].offload_keys == [group_key(req.block_hashes[i], 1) for i in (1, 3, 5)]


class TestStores:
    def test_the_window_stores_only_the_chunks_before_the_prompts_replay_boundary(self):
        """_build_store_jobs with reachable_block_mask, vLLM's default retention (0): of a
        20-token prompt full attention stores chunks 0-4, the window only 2 and 3 (the two a
        lookup ending at token 16, the replay boundary of 19 rounded down, reads)."""
        groups = Groups()
        groups.prefill_and_finish("A", prompt(20), first_block=1)
        assert groups.stored[("A", 0)] == {0, 1, 2, 3, 4}
        assert groups.stored[("A", 1)] == {2, 3}

    def test_a_running_request_stores_each_chunk_its_decode_completes(self):
        """_update_req_states refreshes every scheduled request's keys: the chunk tokens 8-11 fill
        is keyed once token 11 is sampled and stored by the step that computes it (dense
        retention: the window stores it too), not only when the request finishes."""
        groups = Groups(retention=None)
        req = groups.add("A", prompt(8))
        groups.connector.get_num_new_matched_tokens(req, 0)
        groups.step({"A": 8}, {"A": [[1, 2], [3, 4]]})
        req.append_tokens(prompt(1, seed=3))
        groups.step({"A": 1}, {"A": [[5], [6]]})
        for token in prompt(3, seed=4):
            req.append_tokens([token])
            groups.step({"A": 1})
        assert groups.stored[("A", 0)] == groups.stored[("A", 1)] == {0, 1, 2}

    def test_with_dense_retention_the_window_stores_every_chunk(self):
        groups = Groups(retention=None)
        groups.prefill_and_finish("A", prompt(20), first_block=1)
        assert groups.stored[("A", 1)] == {0, 1, 2, 3, 4}


class TestLookup:
    def test_a_window_hit_ends_where_its_group_holds_a_whole_window(self):
        """_lookup_complete_chunks: full attention holds chunks 0-4 of the 28-token follow-up,
        the window only 2 and 3, so the hit is the 16 tokens both agree on; the load carries full
        attention's chunks 0-3 and the window's 2-3 (its blocks from token 16 - 7 on; the two
        before are null)."""
        groups = Groups()
        groups.prefill_and_finish("A", prompt(20), first_block=1)
        follow = groups.add("B", prompt(20) + prompt(8, seed=2))
        hits, load = groups.connector.get_num_new_matched_tokens(follow, 0)
        assert (hits, load) == (16, True)
        groups.connector.update_state_after_alloc(follow, ((21, 22, 23, 24), (0, 0, 25, 26)), hits)
        job = groups.step().load_jobs[0]
        assert list(zip(job.chunk_groups, job.chunk_indices)) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
        assert job.gpu_block_ids == (21, 22, 23, 24, 25, 26)

    def test_a_missing_window_chunk_shortens_the_hit_to_the_window_before_it(self):
        """The window's lookup scans from the right: with dense retention every chunk is stored;
        evict window chunk 3 and the hit ends at chunk 2 (chunks 1 and 2 in a row: 12 tokens)."""
        groups = Groups(retention=None)
        groups.prefill_and_finish("A", prompt(20), first_block=1)
        follow = groups.add("B", prompt(20) + prompt(8, seed=2))
        state = groups.connector._requests["B"]
        manager = groups.connector.manager
        manager._chunks.pop(state.groups[1].offload_keys[3])  # the tier lost it (LRU eviction)
        manager._lru.pop(state.groups[1].offload_keys[3])
        manager._free_slots.append(0)
        hits, _ = groups.connector.get_num_new_matched_tokens(follow, 0)
        assert hits == 12

    def test_the_prompts_last_token_is_never_served_with_a_window(self):
        """A window's last prompt token must be recomputed (``max_hit_size_tokens -= 1``): an
        identical 20-token prompt loads 19 tokens, its last chunk short of its last token (the
        hit is not chunk-aligned; the load still copies the whole block 4). Without a window the
        hit would be all 20 (the engine then recomputes the last token itself)."""
        groups = Groups(retention=None)
        groups.prefill_and_finish("A", prompt(20), first_block=1)
        again = groups.add("B", prompt(20))
        assert groups.connector.get_num_new_matched_tokens(again, 0) == (19, True)


class TestReleaseWindowRules:
    """``ReleaseRules.windows`` and ``window_load_spare_block``: vLLM <= 0.29 (the presets
    vllm-0.25, -0.26, -0.29) against 0.30+."""

    def test_up_to_0_29_every_window_chunk_is_stored(self):
        """No reachable mask before 0.30: with one block size there is no segment either, so the
        window stores chunks 0-4 of a 20-token prompt."""
        groups = Groups(fixes=Fixes.preset("vllm-0.29"))
        groups.prefill_and_finish("A", prompt(20), first_block=1)
        assert groups.stored[("A", 1)] == {0, 1, 2, 3, 4}

    @pytest.mark.parametrize("preset", ["vllm-0.25", "vllm-0.26", "vllm-0.28", "vllm-0.29"])
    def test_with_one_block_size_every_preset_up_to_0_29_stores_every_window_chunk(self, preset):
        """0.25-0.26's segment tails (``WindowRules.SEGMENT_TAILS``) need a window group of smaller
        chunks than full attention's: with one block size there is no segment, as in vLLM."""
        groups = Groups(fixes=Fixes.preset(preset))
        groups.prefill_and_finish("A", prompt(20), first_block=1)
        assert groups.stored[("A", 1)] == {0, 1, 2, 3, 4}

    @pytest.mark.parametrize("preset, step, stored", [
        ("vllm-0.25", 8, {1, 2, 4, 5, 7, 8}), ("vllm-0.26", 8, {1, 2, 4, 5, 7, 8}), ("vllm-0.29", 8, set(range(10))),
        (None, 8, {1, 2, 4, 5, 7, 8, 9}), ("vllm-0.26", 16, {1, 2, 4, 5, 7, 8}), ("vllm-0.29", 16, set(range(1, 10))),
        ("vllm-0.29", 24, {1, 2, 4, 5, 7, 8, 9}), (None, 16, {1, 2, 4, 5, 7, 8, 9})])
    def test_nested_grids_store_the_window_chunks_of_each_release(self, preset, step, stored):
        """K15's story (``nested-blocks-tiny``: 12-token chunks beside an 8-token window of 4-token
        chunks, dense retention; 40 tokens prefilled ``step`` a step): 0.25-0.26 store each whole
        segment's last two window chunks, not the prompt's 9; 0.27-0.29 the last two before each
        step's frontier too (``WindowRules.FRONTIER_TAILS``): 8 a step, frontiers 8, 16 and 32 add
        chunks 0, 3 and 6; 16 a step, 16 and 32 add 3 and 6 (chunk 0 is no tail); 24 a step, 24 is
        a segment's end and adds none; 0.30+ the segments' and the prompt's tails."""
        groups = Groups(retention=None, cpu_chunks=64, fixes=Fixes.preset(preset) if preset else None,
                        model="nested-blocks-tiny")
        req = groups.add("C", prompt(40))
        groups.connector.get_num_new_matched_tokens(req, 0)
        for done in range(0, 40, step):
            last = min(done + step, 40)
            full = list(range(100 + cdiv(done, 12), 100 + cdiv(last, 12)))
            groups.step({"C": last - done}, {"C": [full, list(range(1 + done // 4, 1 + last // 4))]})
        assert groups.stored[("C", 1)] == stored

    @pytest.mark.parametrize("preset, stored", [(None, {1, 2, 3}), ("vllm-0.30", {1, 2, 3}), ("vllm-0.29", {0, 1, 2, 3})])
    def test_an_abort_mid_prefill_stores_the_window_tail_before_its_end(self, preset, stored, monkeypatch):
        """K15's grids, C (40 tokens) prefilled 8 a step and aborted at 16: 0.30+ look again at
        the final segment the abort cut short (``reconsider_final_swa_tail``) and store chunk 3,
        which the prompt's horizon left unreachable when the cursor passed it (vLLM 0.32.0's stock
        connector stores 1, 2 and 3, tests/vllm/test_k15_k16_block_sizes.py); without that look
        (planted) only 1 and 2. 0.27-0.29 stored each step's frontier tail anyway."""
        def run():
            groups = Groups(retention=None, cpu_chunks=64, fixes=Fixes.preset(preset) if preset else None,
                            model="nested-blocks-tiny")
            req = groups.add("C", prompt(40))
            groups.connector.get_num_new_matched_tokens(req, 0)
            groups.step({"C": 8}, {"C": [[100], [1, 2]]})
            groups.step({"C": 8}, {"C": [[101], [3, 4]]})
            req.status = RequestStatus.FINISHED_ABORTED
            groups.connector.request_finished(req, ((100, 101), (1, 2, 3, 4)))
            groups.step(finished=["C"])
            return groups.stored[("C", 1)]

        assert run() == stored
        if preset != "vllm-0.29":
            from kvoffload.core.hybrid_stores import HybridStorePlanner

            monkeypatch.setattr(HybridStorePlanner, "_final_tail", lambda self, req, g, cursor, end: None)
            assert run() == {1, 2}

    def test_0_25_and_0_26_bound_a_loads_window_blocks_by_the_window(self):
        """``ReleaseRules.window_load_spare_block``: K16's bound, the window in blocks (one here),
        one more from 0.27 (PR #49052)."""
        config = ConnectorConfig(block_size=4, blocks_per_chunk=1, cpu_chunks=8, model="mixed-blocks-tiny")
        bounds = {preset: connector_scheduler(config, Fixes.preset(preset)).pending_window_blocks(1)
                  for preset in PRESETS}
        assert bounds == {"vllm-0.25": 1, "vllm-0.26": 1, "vllm-0.28": 2, "vllm-0.29": 2, "vllm-0.30": 2}
        assert connector_scheduler(config, Fixes()).pending_window_blocks(1) == 2

    @pytest.mark.parametrize("preset, answer", [(None, (8, True)), ("vllm-0.29", (None, False))])
    def test_a_pending_window_chunk_behind_a_miss_defers_only_before_0_30(self, preset, answer):
        """Window chunks (from the right) pending, missing, hit, hit: PR #56486 (0.30) lets the
        run of chunks 0-1 answer (8 tokens); before it the pending chunk defers the lookup."""
        groups = Groups(retention=None, fixes=Fixes.preset(preset) if preset else None)
        groups.prefill_and_finish("A", prompt(16), first_block=1)  # chunks 0-3 of both groups
        follow = groups.add("B", prompt(16) + prompt(8, seed=2))
        state, manager = groups.connector._requests["B"], groups.connector.manager
        keys = state.groups[1].offload_keys
        for key in keys[2:4]:  # forget window chunks 2-3 ...
            manager._lru.pop(manager._chunks.pop(key) and key)
        manager._free_slots.extend([30, 31])
        groups.add("X", [])  # ... and another request's store of chunk 3 is in flight
        manager.prepare_store("X", [keys[3]])
        assert groups.connector.get_num_new_matched_tokens(follow, 0) == answer


def test_the_dense_model_keeps_the_single_group_connector():
    config = ConnectorConfig(model="dense")
    assert not isinstance(connector_scheduler(config), HybridConnectorScheduler)


@pytest.mark.parametrize("workload", ["qwen3-next-multi-turn-small", "gpt-oss-multi-turn-small"])
def test_the_stats_count_each_store_job_and_each_chunk_it_hands_over_once(workload):
    """The result's ``connector_stats`` on a hybrid model: ``store_jobs`` is the store jobs the
    connector built (a Mamba state's own included), ``chunks_stored`` the chunks they carry."""
    from kvoffload.choice import ConnectorChoice
    from kvoffload.engine.engine import Engine
    from kvoffload.workloads import load_workload

    loaded = load_workload(workload)
    engine = Engine(loaded.requests, loaded.engine, ConnectorChoice.build().fixes)
    built, stores = engine.connector.build_connector_meta, []

    def tapped(out):
        plan = built(out)
        stores.extend(plan.store_jobs)
        return plan

    engine.connector.build_connector_meta = tapped
    stats = engine.run().connector_stats
    assert stores and (stats["store_jobs"], stats["chunks_stored"]) == (len(stores),
                                                                       sum(len(job.chunk_slots) for job in stores))
