"""Memory follows what is live: fingerprints and finished requests are not kept for the run.

Fingerprints (8 bytes per scripted token) are made when a request first runs or loads (not
while it waits) and dropped when it finishes; a whole-workload arena would grow with the trace (1.2 GB for Mooncake's conversation
trace). A finished request (its token list and block hashes) is kept only while follow-ups will
read it as their parent. Checked at every step of replays that finish, abort and preempt.
"""

from __future__ import annotations

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.engine import Engine
from kvoffload.workloads import load_workload


@pytest.mark.parametrize("name, settings", [
    ("multi-turn-small", {}),  # aborts and follow-ups
    ("multi-turn-small", {"gpu_blocks": "28", "scheduling": "async"}),  # a small pool: preemptions
    ("shared-prefix-small", {"gpu_blocks": "28"}),
])
def test_fingerprints_are_held_exactly_while_a_request_lives(name, settings):
    workload = load_workload(name, settings)
    held_vs_live, made_vs_live = [], []  # fingerprints are made lazily: at a request's first forward or load

    def on_step(step: int, finished: int) -> None:
        held_vs_live.append((engine.oracle.num_registered(), len(engine.scheduler.live)))
        made_vs_live.append((engine.oracle.num_fingerprinted(), len(engine.scheduler.live)))

    engine = Engine(workload.requests, workload.engine, Fixes(), on_step=on_step)
    record = engine.run()
    assert record.crash is None and not record.poisoned
    assert record.preemptions > 0 or not settings
    assert all(held == live for held, live in held_vs_live)
    assert max(live for _, live in held_vs_live) > 1
    assert all(made <= live for made, live in made_vs_live) and max(made for made, _ in made_vs_live) > 1
    assert engine.oracle.num_registered() == 0 and engine.oracle.num_fingerprinted() == 0
    assert set(engine.scheduler.finished) == {spec.parent for spec in workload.requests if spec.parent}
    assert record.finished_requests == len(workload.requests)
