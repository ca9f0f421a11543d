"""An aborted parent's load in flight: both engines date the parent's last fully-written chunk by
what its scheduler saw computed (docs/fidelity.md, "An aborted parent's load in flight").

A (16 prompt tokens) finishes and is offloaded; F fills the GPU pool, so A's blocks leave vLLM's
prefix cache; B extends A's prompt, is admitted with a 16-token connector load and is aborted one
or two steps after it arrives; C is B's next turn. vLLM counts B's load as computed at admission;
until its scheduler has seen the load land (``finished_recving``: the step after the copy in sync,
one step later in async), B got only as far as its GPU hit (0 tokens), so C is no continuation of
a written chunk. Once the load is seen, B's chunks count as written and C, served from the CPU
tier, is an eligible continuation.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.core.fixes import Fixes  # noqa: E402
from kvoffload.engine.engine import Engine  # noqa: E402
from kvoffload.engine.record import Continuation  # noqa: E402
from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates.story import TINY, tokens  # noqa: E402
from kvoffload.vllm.build import REFERENCE, ConnectorLoad  # noqa: E402
from kvoffload.vllm.replay import VllmSchedulerReplay  # noqa: E402


def story(abort_after_steps: int) -> list[RequestSpec]:
    a = RequestSpec("A", tokens(1, 16), tokens(2, 2))
    filler = RequestSpec("F", tokens(3, 120), tokens(4, 2), arrival_step=6)
    b = RequestSpec("B", a.prompt_token_ids + a.output_token_ids + tokens(5, 8), tokens(6, 4), arrival_step=12,
                    abort_after_steps=abort_after_steps)
    c = RequestSpec("C", b.prompt_token_ids + tokens(7, 4), tokens(8, 2), parent="B", think_steps=2)
    return [a, filler, b, c]


SEEN = [Continuation("C", "B", eligible=True, served=True)]


@pytest.mark.parametrize(("scheduling", "abort_after_steps", "continuations"), [
    ("sync", 1, []),  # aborted while the load is copied
    ("sync", 2, SEEN),  # the load landed and vLLM's scheduler saw it, though B still waits for it
    pytest.param("async", 1, [], marks=pytest.mark.vllm_on_demand),  # CI's stage keeps its time
    pytest.param("async", 2, [], marks=pytest.mark.vllm_on_demand),  # async: the landing is seen a step later
])
def test_the_follow_up_of_a_parent_aborted_with_its_load_in_flight(scheduling, abort_after_steps, continuations):
    requests, config = story(abort_after_steps), TINY.replace(scheduling=scheduling)
    replay = VllmSchedulerReplay(requests, config, ConnectorLoad(REFERENCE))
    real = replay.run()
    assert replay.ledger.first_admission["B"] == (0, 16)  # the load this story is about
    simulated = Engine(requests, config, Fixes()).run()
    assert simulated.continuations == real.continuations == continuations
