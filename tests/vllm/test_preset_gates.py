"""The 0.26 preset fails the gates of the bugs vLLM 0.26.0 shipped, and no others.

vLLM 0.26.0 tells its manager ``on_request_finished`` before it builds the finished request's
last store (``request_finished`` then ``_build_store_jobs`` on the next schedule: K01, vLLM
#49635). Its CPU manager keeps no per-request state (``on_request_finished`` is the base class's
no-op), so nothing a user sees changes; only a strict manager, the reference's, records it. The
gates leave that record to K01's gate: K06's story, replayed with the preset, carries K01's
violation and still passes, as K06 does against 0.26.0's own connector (docs/fidelity.md, "The
gates of a preset")."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_on_demand]  # scripts/vllm-on-demand

from kvoffload.core.types import LifecycleEvent  # noqa: E402
from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates import test_k06_k20_lifecycle as lifecycle  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402
from kvoffload.gates.story import TINY, follow_up, replay, tokens  # noqa: E402

PRESET_026 = GateConnector("reference", "vllm-0.26")


def test_k06_story_under_the_026_preset_shows_k01_only_to_a_strict_manager():
    a = RequestSpec("A", tokens(1, 8), tokens(2, 13), accept_counts=(5,))  # K06's story
    record, built = replay(PRESET_026, [a, follow_up(a)], TINY.replace(spec_tokens=5),
                           forget_gpu_cache_before=tuple(range(1, 12)))
    # A's last chunk is prepared one schedule after its finish signal: K01's bug, shipped by 0.26.
    assert built.scheduler.connector.core.manager.violations == [
        LifecycleEvent(req_id="A", call="prepare_store", reason="after on_request_finished")]
    assert (record.crash, record.poisoned, record.connector_hit_tokens_admitted) == (None, [], 20)
    lifecycle.TestK06CursorWaitsForHashes().test_every_decode_chunk_is_stored(PRESET_026)  # K06 passes
