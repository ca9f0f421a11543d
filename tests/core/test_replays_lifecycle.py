"""Replays of the job-lifecycle bugs (docs/design.md): reset, preemption, re-admission, acks."""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.core.types import ConnectorCrash, RequestStatus

EOS = 50256



class TestResetCache:
    def _decoding_with_store_in_flight(self, script, fixes):
        s = script(fixes=fixes)
        a = s.add("A", list(range(8)))
        s.admit(a, [1, 2])
        plan = s.step(scheduled={"A": 8}, new_blocks={"A": [1, 2]})
        assert plan.store_jobs
        s.connector.reset_cache()
        flush_plan = s.step()
        assert {job.job_id for job in plan.store_jobs} <= flush_plan.jobs_to_flush
        s.complete(*[job.job_id for job in plan.store_jobs])  # stale: ignored
        return s, a

    def test_preempted_request_is_readmitted_after_reset(self, script):
        """PR #48102: the surviving request's job ids are cleared with the job table."""
        s, a = self._decoding_with_store_in_flight(script, Fixes())
        s.step(preempted=["A"])
        a.num_computed_tokens = 0
        assert s.admit(a, [3, 4]) == 0
        assert s.connector.next_stored_chunk("A") == 0

    def test_without_the_fix_preempting_the_survivor_is_a_key_error(self, script):
        """vLLM 0.25: build_connector_meta looks the preempted request's first job id up in the
        job table reset_cache emptied (PR #48102)."""
        s, a = self._decoding_with_store_in_flight(script, Fixes().without("reset_clears_request_jobs"))
        with pytest.raises(ConnectorCrash, match="KeyError in build_connector_meta"):
            s.step(preempted=["A"])

    def test_without_the_fix_the_survivors_next_store_is_a_key_error(self, script):
        s, a = self._decoding_with_store_in_flight(script, Fixes().without("reset_clears_request_jobs"))
        s.sample("A", 8, 9, 10, 11)
        with pytest.raises(ConnectorCrash, match="KeyError in _build_store_jobs"):
            s.step(scheduled={"A": 4}, new_blocks={"A": [3]})

    def test_without_the_fix_a_waiting_request_defers_forever_then_dies_at_finish(self, script):
        """A was preempted with its store flushed but unreported when the reset came: its stale
        id keeps every lookup waiting, and the abort that gives up on it is a KeyError."""
        s = script(fixes=Fixes().without("reset_clears_request_jobs"))
        a = s.add("A", list(range(8)))
        s.admit(a, [1, 2])
        assert s.step(scheduled={"A": 8}, new_blocks={"A": [1, 2]}).store_jobs
        s.step(preempted=["A"])
        a.num_computed_tokens = 0
        s.connector.reset_cache()
        for _ in range(5):
            assert s.admit(a, [3, 4]) is None  # stuck in the waiting queue
        with pytest.raises(ConnectorCrash, match="KeyError in request_finished"):
            s.finish("A", status=RequestStatus.FINISHED_ABORTED)

    def test_stale_completion_after_reset_does_not_complete_new_jobs(self, script):
        s = script()
        a = s.add("A", list(range(4)))
        s.admit(a, [1])
        old = s.step(scheduled={"A": 4}, new_blocks={"A": [1]}).store_jobs[0]
        s.connector.reset_cache()
        s.step()
        s.complete(old.job_id)
        assert s.manager.num_chunks == 0
        assert not s.connector.has_pending_work()


class TestPreemption:
    def test_preemption_flushes_every_in_flight_store(self, script):
        s = script()
        a = s.add("A", list(range(12)))
        s.admit(a, [1, 2, 3])
        first = s.step(scheduled={"A": 8}, new_blocks={"A": [1, 2, 3]})
        second = s.step(scheduled={"A": 4})
        plan = s.step(preempted=["A"])
        assert plan.jobs_to_flush == {j.job_id for j in first.store_jobs + second.store_jobs}

    @pytest.mark.parametrize("fixed", [True, False])
    def test_readmission_before_the_flush_is_reported(self, script, fixed):
        """Issue #46014 (async): A is re-admitted with a hit while its flushed store is unreported."""
        from kvoffload.core.manager import LookupResult

        fixes = Fixes() if fixed else Fixes().without("defer_lookup_while_transferring")
        s = script(fixes=fixes)
        # The manager of that era counted only ready chunks: a pending one looked like a miss.
        plain_lookup = s.manager.lookup
        s.manager.lookup = lambda key: (LookupResult.MISS if plain_lookup(key) is LookupResult.HIT_PENDING
                                        else plain_lookup(key))
        s.store_prefix("P", [5, 5, 5, 5], [1])  # chunk [5,5,5,5] is in the tier
        a = s.add("A", [5, 5, 5, 5, 6, 6, 6, 6])
        s.admit(a, [2, 3], local_tokens=0)  # A loads chunk 0 ...
        load = s.step().load_jobs[0]
        s.complete(load.job_id)
        a.num_computed_tokens = 4
        plan = s.step(scheduled={"A": 4}, new_blocks={"A": [2, 3]})
        (store,) = plan.store_jobs
        s.step(preempted=["A"])  # ... stores chunk 1, is preempted: the store is flushed, not yet reported
        a.num_computed_tokens = 0
        if fixed:
            assert s.admit(a, [4, 5]) is None
            s.complete(store.job_id)
            assert s.admit(a, [4, 5]) == 8  # both chunks: the engine recomputes the last token itself
        else:
            with pytest.raises(ConnectorCrash, match="transfer_jobs"):
                s.admit(a, [4, 5])


class TestLoads:
    def test_load_job_copies_the_hit_chunks_into_the_new_blocks(self, script):
        s = script()
        s.store_prefix("P", [1, 2, 3, 4, 5, 6, 7, 8], [1, 2])
        b = s.add("B", [1, 2, 3, 4, 5, 6, 7, 8, 9])
        assert s.admit(b, [3, 4, 5]) == 8
        (load,) = s.step().load_jobs
        assert load.gpu_block_ids == (3, 4)
        assert load.chunk_indices == (0, 1)
        assert s.connector.jobs.fenced_blocks == frozenset()  # loads never enter the fence

    def test_load_after_a_partial_gpu_hit_starts_mid_chunk(self, script):
        s = script(blocks_per_chunk=4)
        s.store_prefix("P", list(range(32)), list(range(1, 9)))
        b = s.add("B", list(range(33)))
        # GPU hit: one block; the tier adds the rest of chunk 0 and all of chunk 1
        assert s.admit(b, [1, 10, 11, 12, 13, 14, 15, 16, 17], local_tokens=4) == 28
        (load,) = s.step().load_jobs
        assert (load.gpu_block_ids, load.skip_blocks, load.chunk_indices) == ((10, 11, 12, 13, 14, 15, 16), 1, (0, 1))

    def test_second_request_waits_while_the_first_loads_the_same_chunk(self, script):
        s = script()
        s.store_prefix("P", [1, 2, 3, 4], [1])
        b = s.add("B", [1, 2, 3, 4, 9])
        c = s.add("C", [1, 2, 3, 4, 8])
        assert s.admit(b, [2, 3]) == 4
        assert s.admit(c, [4, 5]) is None
        (load,) = s.step().load_jobs
        s.complete(load.job_id)
        assert s.admit(c, [4, 5]) == 4

    def test_pending_store_is_a_deferred_hit(self, script):
        s = script()
        p = s.add("P", [1, 2, 3, 4])
        s.admit(p, [1])
        (store,) = s.step(scheduled={"P": 4}, new_blocks={"P": [1]}).store_jobs
        b = s.add("B", [1, 2, 3, 4, 5])
        assert s.admit(b, [2, 3]) is None
        s.complete(store.job_id)
        assert s.admit(b, [2, 3]) == 4


class TestWorkerAcks:
    def test_job_completes_only_after_every_worker_acked(self, script):
        s = script(num_workers=3)
        a = s.add("A", [1, 2, 3, 4])
        s.admit(a, [1])
        (store,) = s.step(scheduled={"A": 4}, new_blocks={"A": [1]}).store_jobs
        s.complete(store.job_id, workers=2)
        assert s.manager.state_of(a.block_hashes[0]) == "pending"
        s.complete(store.job_id)
        assert s.manager.state_of(a.block_hashes[0]) == "ready"

    def test_failed_store_leaves_no_visible_key(self, script):
        s = script(num_workers=2)
        a = s.add("A", [1, 2, 3, 4])
        s.admit(a, [1])
        (store,) = s.step(scheduled={"A": 4}, new_blocks={"A": [1]}).store_jobs
        s.complete(store.job_id, success=False)
        s.complete(store.job_id)
        assert s.manager.state_of(a.block_hashes[0]) == "absent"


class TestConfiguration:
    @pytest.mark.parametrize("kwargs, message", [
        ({"cpu_chunks": 0}, "cpu_chunks must be a positive integer, got 0"),
        ({"blocks_per_chunk": 0}, "blocks_per_chunk must be a positive integer, got 0"),
        ({"block_size": -4}, "block_size must be a positive integer, got -4"),
        ({"block_size": True}, "block_size must be a positive integer, got True"),  # a bool is no count
        ({"cpu_chunks": 4.0}, "cpu_chunks must be a positive integer, got 4.0"),
        ({"num_workers": "2"}, "num_workers must be a positive integer, got '2'"),
    ])
    def test_invalid_geometry_names_the_value(self, kwargs, message):
        from kvoffload.core.types import ConfigError, ConnectorConfig

        with pytest.raises(ConfigError, match=message):
            ConnectorConfig(**kwargs)

    def test_unknown_fix_and_preset_are_named(self):
        from kvoffload.core.types import ConfigError

        with pytest.raises(ConfigError, match="unknown fix 'last_block'"):
            Fixes().without("last_block")
        with pytest.raises(ConfigError, match="unknown preset 'vllm-0.99'"):
            Fixes.preset("vllm-0.99")

    def test_presets_replay_the_release_table(self):
        from kvoffload.core.fixes import Recency

        assert Fixes.preset("vllm-0.30").disabled() == ()  # every fix, but 0.30's recency
        assert Fixes.preset("vllm-0.30").rules.recency is Recency.TOUCH_ON_ACCESS
        assert Fixes().rules.recency is Recency.RANK_AT_INSERT  # the reference follows 0.32
        assert not Fixes.preset("vllm-0.25").rules.store_cursor_monotonic
        assert Fixes.preset("vllm-0.26").rules.store_cursor_monotonic
        assert Fixes.preset("vllm-0.29").disabled() == ("final_token_watermark",)
        assert "deferred_finish_signal" in Fixes.preset("vllm-0.26").disabled()
        assert "last_block_at_finish" not in Fixes.preset("vllm-0.26").disabled()
        assert "last_block_at_finish" in Fixes.preset("vllm-0.25").disabled()
