"""The arrival feed: roots arrive at their own step, a follow-up ``think_steps`` after its
parent finished, and a follow-up queued while other arrivals wait takes its place among them."""

from __future__ import annotations

from kvoffload.engine.feed import ArrivalFeed
from kvoffload.engine.requests import RequestSpec


def test_a_follow_up_due_between_two_waiting_arrivals_delays_neither():
    """X (step 20) and Y (step 30) wait when R finishes at step 10; R's follow-up C thinks 14
    steps, so it is due at 25, between them. Everyone arrives on time: X is not held behind C,
    nor C behind Y."""
    requests = [RequestSpec("R", (1, 2), (3,)), RequestSpec("X", (4, 5), (6,), arrival_step=20),
                RequestSpec("Y", (7, 8), (9,), arrival_step=30),
                RequestSpec("C", (1, 2, 3, 10), (11,), parent="R", think_steps=14)]
    feed = ArrivalFeed(requests)
    arrived = {}
    for step in range(40):
        arrived.update((spec.req_id, step) for spec in feed.arrivals(step))
        if step == 10:
            feed.parent_finished("R", step)
    assert arrived == {"R": 0, "X": 20, "C": 25, "Y": 30}
    assert not feed.has_pending()


def test_a_follow_up_that_names_no_think_time_arrives_the_step_after_its_parent_finished():
    feed = ArrivalFeed([RequestSpec("R", (1, 2), (3,)), RequestSpec("C", (1, 2, 3, 4), (5,), parent="R")])
    assert [spec.req_id for spec in feed.arrivals(0)] == ["R"]
    feed.parent_finished("R", 6)
    assert feed.next_arrival_step() == 7
    assert [spec.req_id for spec in feed.arrivals(7)] == ["C"]
