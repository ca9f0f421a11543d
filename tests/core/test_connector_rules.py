"""Connector rules that no fix flag covers (docs/design.md, "Connector rules").

Each story replays one rule of vLLM's offloading connector as the release named in the test
does it: the complete-chunk rule of the lookup (every release), the CPU tier's recency
(touch-on-access up to 0.30, rank-at-insert from 0.31), and 0.25's rewinding store cursor.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes, Recency, ReleaseRules
from kvoffload.core.manager import CPUOffloadManager, LookupResult

EOS = 50256

REFERENCE = Fixes()  # vLLM 0.32
VLLM_0_30 = Fixes.preset("vllm-0.30")



def _evicted_by_one_more_store(s, tokens, block):
    """A fresh request stores one chunk into the full tier; returns the keys that made room."""
    evicted = []
    plain = s.manager.prepare_store

    def recording(req_id, keys, positions=None):
        out = plain(req_id, keys, positions)
        if out is not None:
            evicted.extend(out.evicted_keys)
        return out

    s.manager.prepare_store = recording
    r = s.add("R", tokens)
    s.admit(r, [block])
    s.step(scheduled={"R": len(tokens)}, new_blocks={"R": [block]})
    s.manager.prepare_store = plain
    return evicted


class TestCompleteChunkRule:
    """vLLM's _lookup_complete_chunks: less than one whole chunk past the GPU hit reports 0."""

    def test_a_chunk_whose_tail_is_shorter_than_a_chunk_is_not_loaded(self, script):
        s = script(blocks_per_chunk=4)  # 16 tokens per chunk
        s.store_prefix("P", list(range(16)), [1, 2, 3, 4])
        b = s.add("B", list(range(33)))
        queried = s.connector.stats.queried_tokens
        # the tier holds chunk 0 (not 1); the GPU already has its first block: 12 tokens to gain
        assert s.admit(b, [1, 6, 7, 8, 9, 10, 11, 12, 13], local_tokens=4) == 0
        assert not s.step().load_jobs
        assert s.connector.stats.queried_tokens - queried == 28  # the tier was asked

    def test_the_same_chunk_is_loaded_without_a_gpu_hit(self, script):
        s = script(blocks_per_chunk=4)
        s.store_prefix("P", list(range(16)), [1, 2, 3, 4])
        b = s.add("B", list(range(17)))
        assert s.admit(b, [6, 7, 8, 9, 10]) == 16

    def test_no_query_when_the_keyed_tokens_past_the_gpu_hit_are_under_a_chunk(self, script):
        s = script(blocks_per_chunk=4)
        s.store_prefix("P", list(range(16)), [1, 2, 3, 4])
        b = s.add("B", list(range(17)))
        queried = s.connector.stats.queried_tokens
        s.admit(b, [1, 6, 7, 8, 9], local_tokens=4)
        assert s.connector.stats.queried_tokens == queried  # nothing asked of the tier


class TestNullBlocks:
    """A chunk whose last block is the null block (0: vLLM's placeholder after a reset, or a
    skipped prefix) holds no KV: the store takes the chunks around it, from their own blocks."""

    def test_the_store_skips_the_chunks_that_end_in_the_null_block(self, script):
        s = script()
        a = s.add("A", list(range(3, 15)))  # 3 chunks of 4
        s.admit(a, [0, 5, 6])
        plan = s.step(scheduled={"A": 12}, new_blocks={"A": [0, 5, 6]})
        [job] = plan.store_jobs
        assert (job.chunk_indices, job.gpu_block_ids) == ((1, 2), (5, 6))


    def test_a_decode_step_checks_the_block_of_the_chunk_it_completes(self, script):
        """The decode step's shortcut (one chunk completed): chunk 3 ends in block 7, not in the
        null block that chunk 0 ends in, so it is stored."""
        s = script()
        a = s.add("A", list(range(3, 18)))  # 15 tokens
        s.admit(a, [0, 5, 6, 7])
        assert s.step(scheduled={"A": 12}, new_blocks={"A": [0, 5, 6, 7]}).store_jobs[0].chunk_indices == (1, 2)
        assert s.step(scheduled={"A": 3}).store_jobs == ()
        s.sample("A", 40)  # the 16th token: chunk 3 is complete once it is computed
        [job] = s.step(scheduled={"A": 1}).store_jobs
        assert (job.chunk_indices, job.gpu_block_ids) == ((3,), (7,))


    def test_with_three_blocks_per_chunk_a_chunk_is_judged_by_its_last_block(self, script):
        """vLLM's _build_store_jobs takes each chunk's last block (its example: blocks 1 5 6 7 2 4
        9 3 8 select 6 4 8) and skips a chunk only when that block is the null block. A's second
        store starts at chunk 1, whose first block is the null block and whose last is live: it
        is stored with chunk 2."""
        s = script(blocks_per_chunk=3)  # 12 tokens per chunk
        a = s.add("A", list(range(3, 39)))  # 3 chunks
        s.admit(a, [1, 5, 6])
        assert s.step(scheduled={"A": 12}, new_blocks={"A": [1, 5, 6]}).store_jobs[0].chunk_indices == (0,)
        [job] = s.step(scheduled={"A": 24}, new_blocks={"A": [0, 2, 4, 9, 3, 8]}).store_jobs
        assert job.chunk_indices == (1, 2)


class TestCompletionReports:
    def test_a_report_that_does_not_say_otherwise_is_a_success(self, script):
        """TransferResult's ``success`` defaults to true: the store lands and serves a hit."""
        from kvoffload.core.types import TransferResult

        s = script()
        a = s.add("A", list(range(3, 11)))
        s.admit(a, [1, 2])
        plan = s.step(scheduled={"A": 8}, new_blocks={"A": [1, 2]})
        s.connector.update_connector_output([TransferResult(job.job_id) for job in plan.store_jobs])
        assert [s.manager.lookup(key) for key in a.block_hashes] == [LookupResult.HIT] * 2


class TestRecency:
    """Which ready chunk the tier evicts after a request used X while Y was stored later."""

    @pytest.mark.parametrize("use", ["zero-hit lookup", "deferred lookup", "store that allocated"])
    @pytest.mark.parametrize("fixes, evicted", [(VLLM_0_30, "Y"), (REFERENCE, "X")], ids=["0.30", "0.32"])
    def test_up_to_0_30_every_use_touches_the_requests_keys(self, script, use, fixes, evicted):
        s = script(cpu_chunks=4 if use == "store that allocated" else 3, fixes=fixes)  # full below
        x = s.store_prefix("P", [1, 1, 1, 1], [1]).block_hashes[0]
        # W shares X's block on the GPU; it stores its second chunk Z (left pending)
        w = s.add("W", [1, 1, 1, 1, 3, 3, 3, 3])
        s.admit(w, [1, 2], local_tokens=4)
        s.step(scheduled={"W": 4}, new_blocks={"W": [1, 2]})
        y = s.store_prefix("Q", [2, 2, 2, 2], [3]).block_hashes[0]  # Y: newer than X
        b = s.add("B", [1, 1, 1, 1, 3, 3, 3, 3, 9])
        if use == "zero-hit lookup":
            assert s.admit(b, [1, 4, 5], local_tokens=8) == 0
        elif use == "deferred lookup":
            assert s.admit(b, [4, 5, 6]) is None  # X hits, Z is still being written
        else:
            s.sample("W", 4, 4, 4, 4)
            w.num_computed_tokens = 8
            assert s.step(scheduled={"W": 4}, new_blocks={"W": [7]}).store_jobs
        assert s.manager.num_chunks == s.config.cpu_chunks
        victims = _evicted_by_one_more_store(s, [8, 8, 8, 8], 9)
        assert victims[:1] == [{"X": x, "Y": y}[evicted]]

    @pytest.mark.parametrize("finished, evicted", [(False, "X"), (True, "Y")])
    def test_from_0_31_a_request_reranks_what_it_loaded_when_it_finishes(self, script, finished, evicted):
        s = script(cpu_chunks=2)
        x = s.store_prefix("P", [1, 1, 1, 1], [1]).block_hashes[0]
        y = s.store_prefix("Q", [2, 2, 2, 2], [2]).block_hashes[0]
        b = s.add("B", [1, 1, 1, 1, 9])
        assert s.admit(b, [3, 4]) == 4
        s.complete(s.step().load_jobs[0].job_id)  # the load landed: X is evictable again, still old
        if finished:
            s.sample("B", EOS)
            s.finish("B")
            s.step(finished=["B"])
        victims = _evicted_by_one_more_store(s, [8, 8, 8, 8], 5)
        assert victims == [{"X": x, "Y": y}[evicted]]


    @pytest.mark.parametrize("finished, evicted", [(False, "X"), (True, "Y")])
    def test_from_0_31_a_request_reranks_what_it_stored_when_it_finishes(self, script, finished, evicted):
        s = script(cpu_chunks=2)
        a = s.add("A", [1, 1, 1, 1, 5])
        s.admit(a, [1, 2])
        s.complete(*[j.job_id for j in s.step(scheduled={"A": 5}, new_blocks={"A": [1, 2]}).store_jobs])
        x = a.block_hashes[0]  # stored by A while it runs: ranked then, not since
        y = s.store_prefix("Q", [2, 2, 2, 2], [3]).block_hashes[0]
        if finished:
            s.sample("A", EOS)
            s.finish("A")
            s.step(finished=["A"])
        victims = _evicted_by_one_more_store(s, [8, 8, 8, 8], 5)
        assert victims == [{"X": x, "Y": y}[evicted]]


class TestManagerRecency:
    def keys(self, *names):
        return [name.encode() for name in names]

    @pytest.mark.parametrize("recency, victim", [(Recency.TOUCH_ON_ACCESS, "b"), (Recency.RANK_AT_INSERT, "a")])
    def test_a_chunk_ranks_from_its_insert_not_its_completion(self, recency, victim):
        m = CPUOffloadManager(3, recency=recency)
        m.on_new_request("r")
        a, b, c, d = self.keys("a", "b", "c", "d")
        m.prepare_store("r", [a])
        m.prepare_store("r", [b])
        m.complete_store([b])
        m.complete_store([a])  # a's copy landed last
        m.prepare_store("r", [c])
        m.complete_store([c])
        assert m.prepare_store("r", [d]).evicted_keys == (victim.encode(),)
        m.check_invariants()

    @pytest.mark.parametrize("recency, victim", [(Recency.TOUCH_ON_ACCESS, "b"), (Recency.RANK_AT_INSERT, "a")])
    def test_a_finished_load_refreshes_only_up_to_0_30(self, recency, victim):
        m = CPUOffloadManager(2, recency=recency)
        m.on_new_request("r")
        a, b, c = self.keys("a", "b", "c")
        m.prepare_store("r", [a, b])
        m.complete_store([a, b])
        m.prepare_load("r", [a])
        m.complete_load([a])
        assert m.prepare_store("r", [c]).evicted_keys == (victim.encode(),)

    def evicted_after_r_finishes(self, m, d):
        """w stores ``d``, r finishes, then w stores four new chunks into the full tier of 4: the
        keys evicted, oldest first."""
        m.prepare_store("w", [d])
        m.complete_store([d])
        m.on_request_finished("r")
        evicted = []
        for new in self.keys("e", "f", "g", "h"):
            evicted += m.prepare_store("w", [new]).evicted_keys
            m.complete_store([new])
        return evicted

    def test_at_finish_a_request_reranks_its_chunks_head_to_tail_by_position(self):
        """0.31+ (cpu/policies/lru.py): on_request_finished re-ranks the keys a request stored or
        loaded in the order of their chunk positions, head newest, whatever order they were
        inserted in. r inserts chunks 2, 0, 1; w stores d after them; once r finishes, d is the
        oldest and r's prefix is evicted tail first: 2, then 1, then 0."""
        m = CPUOffloadManager(4)
        for req in ("r", "w"):
            m.on_new_request(req)
        head, middle, tail, d = self.keys("head", "middle", "tail", "d")
        m.prepare_store("r", [tail, head, middle], positions=[2, 0, 1])
        m.complete_store([tail, head, middle])
        assert self.evicted_after_r_finishes(m, d) == [d, tail, middle, head]
        m.check_invariants()

    def test_without_positions_the_offer_order_is_the_chunk_order(self):
        """A caller that gives no positions (the manager's default): each key takes the next
        position after those the request already offered, across calls."""
        m = CPUOffloadManager(4)
        for req in ("r", "w"):
            m.on_new_request(req)
        head, middle, tail, d = self.keys("head", "middle", "tail", "d")
        m.prepare_store("r", [head, middle])
        m.prepare_store("r", [tail])
        m.complete_store([head, middle, tail])
        assert self.evicted_after_r_finishes(m, d) == [d, tail, middle, head]

    def test_keys_another_request_is_still_storing_are_not_its_access(self):
        m = CPUOffloadManager(3)
        for req in ("w", "r"):
            m.on_new_request(req)
        a, b, c, d = self.keys("a", "b", "c", "d")
        m.prepare_store("w", [a])  # pending for w
        m.prepare_store("r", [a, b])  # r offers a while it is pending: not recorded for r
        m.complete_store([a, b])
        m.prepare_store("w", [c])
        m.complete_store([c])
        m.on_request_finished("r")  # re-ranks b only
        assert m.prepare_store("w", [d]).evicted_keys == (a,)
        assert m.lookup(b) is LookupResult.HIT


class TestStoreCursor:
    """vLLM 0.25's advance_stored_idx assigned the cursor; 0.26 took max(old, new)."""

    @pytest.mark.parametrize("monotonic, cursor_after_first_chunk, offers", [(True, 4, 0), (False, 2, 1)])
    def test_after_preemption_the_0_25_cursor_follows_the_prefill_back(
            self, script, monotonic, cursor_after_first_chunk, offers):
        s = script(fixes=Fixes(rules=ReleaseRules(store_cursor_monotonic=monotonic)))
        a = s.add("A", list(range(16)))
        s.admit(a, [1, 2, 3, 4])
        s.complete(*[j.job_id for j in s.step(scheduled={"A": 16}, new_blocks={"A": [1, 2, 3, 4]}).store_jobs])
        s.sample("A", 99)
        s.step(preempted=["A"])
        a.num_computed_tokens = 0
        # the tier lost chunk 0 meanwhile: A is re-admitted with no hit and prefills again
        plain = s.manager.lookup
        s.manager.lookup = lambda key: LookupResult.MISS if key == a.block_hashes[0] else plain(key)
        assert s.admit(a, [5, 6, 7, 8, 9]) == 0
        s.step(scheduled={"A": 8}, new_blocks={"A": [5, 6, 7, 8, 9]})
        assert s.connector.next_stored_chunk("A") == cursor_after_first_chunk
        calls = len(s.manager.calls)
        s.step(scheduled={"A": 8})
        assert s.manager.calls[calls:].count(("prepare_store", "A")) == offers
        assert s.connector.next_stored_chunk("A") == 4
