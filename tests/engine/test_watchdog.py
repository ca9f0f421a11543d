"""No replay runs forever: vLLM's admission order ends issue 15's livelock, and the progress
watchdog stops any cycle that is left with a verdict naming it."""

from __future__ import annotations

import random

from kvoffload.core.fixes import Fixes
from kvoffload.core.scheduler import ReferenceConnectorScheduler
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import Engine
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.watchdog import ProgressWatchdog
from kvoffload.metrics import compute_metrics


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))


def bursty(seed: int = 13) -> list[RequestSpec]:
    """40 requests on four shared prefixes, arriving in bursts (30 % of them open a new burst)."""
    rng = random.Random(seed)
    prefixes = [tokens(1000 + k, rng.choice((32, 64, 96))) for k in range(4)]
    requests, arrival = [], 0
    for i in range(40):
        if rng.random() < 0.3:
            arrival += rng.randint(5, 60)
        prompt = rng.choice(prefixes) + tokens(i, rng.randint(1, 60))
        requests.append(RequestSpec(f"r{i}", prompt, tokens(5000 + i, rng.randint(1, 40)), arrival_step=arrival))
    return requests


ONE_SEAT = EngineConfig(gpu_blocks=16, cpu_chunks=256, block_size=16, max_num_seqs=1, scheduling="async",
                        max_num_batched_tokens=256)


class TestIssue15Livelock:
    def test_a_bursty_trace_with_one_seat_under_async_finishes(self):
        """Before vLLM's admission order, loads that had landed held the free blocks but waited
        behind a preempted request that kept winning the one seat and preempting itself: 9 of
        these 40 requests finished in 3,000 steps, with 1,106 preemptions. Requests holding
        blocks now go first (vLLM 0.32 kv_holding_waiting), so they run, finish and free them."""
        record = Engine(bursty(), ONE_SEAT, max_steps=5000).run()
        assert record.livelock is None and not record.stuck_requests
        assert record.finished_requests == 40
        assert record.preemptions <= 5


class LivelockingConnector(ReferenceConnectorScheduler):
    """Asks to be asked again about one request, forever: it never starts and never fails."""

    def get_num_new_matched_tokens(self, req, num_local_tokens):
        if req.req_id == "looped":
            return None, False
        return super().get_num_new_matched_tokens(req, num_local_tokens)


class TestWatchdog:
    def engine(self, window: int = 300) -> Engine:
        # A request far in the future keeps every step "busy" for the idle-step detector.
        requests = [RequestSpec("looped", tokens(1, 40), tokens(2, 4)),
                    RequestSpec("late", tokens(3, 40), tokens(4, 4), arrival_step=1_000_000)]
        config = EngineConfig(gpu_blocks=32, block_size=16)
        engine = Engine(requests, config, Fixes(), max_steps=2000)
        engine.connector = LivelockingConnector(config.connector_config(), Fixes())
        engine.scheduler.connector = engine.connector
        engine.watchdog.window = window
        return engine

    def test_a_replay_without_progress_stops_with_a_verdict(self):
        record = self.engine(window=300).run()
        assert record.livelock is not None
        assert record.livelock["window"] == 300 and record.steps == 301
        assert record.stuck_requests == ("looped",)
        assert "no request finished and no new token was computed for 300 steps" in record.livelock_message
        metrics = compute_metrics(record)
        assert metrics["livelock"] == 1 and metrics["stuck_requests"] == 1

    def test_steady_progress_for_longer_than_the_window_is_no_livelock(self):
        """A request that computes new tokens every step, for three windows: no verdict; the
        window counts steps since the last progress, not since the start."""
        watchdog = ProgressWatchdog(store_completion_steps=0, window=10)

        class Item:
            def __init__(self, start):
                self.live = type("Live", (), {"req_id": "a"})()
                self.start, self.num_tokens = start, 1

        assert [watchdog.observe(step, [Item(step)], 0, {"a": 1}) for step in range(30)] == [None] * 30
        assert [watchdog.observe(step, [], 0, {"a": 1}) for step in range(30, 40)][-1] is not None

    def test_a_requests_first_computed_token_is_progress(self):
        """A one-token prompt computed at step 5, then nothing: the window counts from step 5, so
        the verdict comes at step 15, not at step 10."""
        watchdog = ProgressWatchdog(store_completion_steps=0, window=10)

        class Item:
            live = type("Live", (), {"req_id": "a"})()
            start, num_tokens = 0, 1

        verdicts = [watchdog.observe(step, [Item()] if step == 5 else [], 0, {"a": 1}) for step in range(20)]
        assert [step for step, verdict in enumerate(verdicts) if verdict is not None][0] == 15

    def test_the_verdict_names_the_preemption_cycle(self):
        """Recomputing what a preemption threw away is not progress."""
        watchdog = ProgressWatchdog(store_completion_steps=0, window=10)

        class Item:
            def __init__(self, req_id, start, num_tokens):
                self.live = type("Live", (), {"req_id": req_id})()
                self.start, self.num_tokens = start, num_tokens

        verdict = None
        assert watchdog.observe(0, [Item("a", 0, 32)], 0, {"a": 1}) is None
        for step in range(1, 40):
            if step % 2:
                watchdog.preempted("a")
                verdict = watchdog.observe(step, [], 0, {"a": 1})
            else:
                verdict = watchdog.observe(step, [Item("a", 16, 16)], 0, {"a": 1})  # below 32
            if verdict is not None:
                break
        assert verdict is not None and verdict.step == 10
        assert verdict.preemptions == {"a": 5}
        assert "5 preemptions in that window (a x5)" in verdict.describe()

    def test_any_engine_reports_written_ends_the_same_way(self):
        """The vLLM replays pass (request, written up to) pairs: the first pass past the high-water
        mark is progress, a pass that ends at or below it is not, and a finish is."""
        watchdog = ProgressWatchdog(store_completion_steps=0, window=3)
        alive = {"a", "b"}
        assert watchdog.observe_ends(0, [("a", 48), ("b", 16)], 0, alive) is None
        assert watchdog.observe_ends(1, [("a", 48), ("b", 16)], 0, alive) is None  # no progress: 1
        assert watchdog.observe_ends(2, [("b", 17)], 0, alive) is None  # b's 17th position: progress
        assert watchdog.observe_ends(3, [("a", 32)], 0, alive) is None  # recompute
        assert watchdog.observe_ends(4, [], 1, alive) is None  # a request finished: progress
        assert watchdog.observe_ends(5, [("a", 48)], 1, alive) is None
        assert watchdog.observe_ends(6, [("b", 17)], 1, alive) is None
        verdict = watchdog.observe_ends(7, [], 1, alive)
        assert verdict is not None and (verdict.last_progress_step, verdict.window) == (4, 3)
        assert watchdog.observe_ends(8, [], 1, ()) is None  # nothing alive: waiting, not cycling
