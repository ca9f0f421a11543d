"""Each packaged vLLM gate whose bug no fix flag plants is proven here: a connector that ships the
bug (``broken_connector.py``, loaded by module path as ``--kv-connector MODULE:CLASS`` would) makes
the gate's story fail. (The gates a fix flag plants are proven by ``--kv-disable FLAG``:
tests/gates/README.md, ``scripts/gates_table --matrix``; K10's flag is planted here as a
connector too.) K11's and K25's gates fail for no release, preset or fix flag in vLLM's scheduler:
their plants, with the same replays passing against the reference beside them, prove them. In
CI's vLLM stage (about 30 s): a gate's story that stopped failing for its plant is a gate that
no longer catches its bug, and only these runs see it (the packaged gates run against
connectors that pass)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.gates import test_k01_k05_finish as finish  # noqa: E402
from kvoffload.gates import test_k06_k20_lifecycle as lifecycle  # noqa: E402
from kvoffload.gates import test_k13_composed as composed  # noqa: E402
from kvoffload.gates import test_k14_k19_hybrid as hybrid  # noqa: E402
from kvoffload.gates import test_k21_k30_tier as tier  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402

PLANTED = [
    # (gate, its arguments, the connector that ships its bug)
    (tier.TestK21ResetReallyClears().test_nothing_is_served_after_a_reset, {"reset": True},
     "ResetKeepsTierConnector"),
    (tier.TestK23PendingHitResolves().test_a_deferred_lookup_ends_in_a_load, {}, "NeverDefersConnector"),
    (tier.TestK27HitRateCountsEachLookupOnce().test_deferred_lookups_are_not_counted, {}, "NeverDefersConnector"),
    (tier.TestK22FailedLoadIsRecomputed().test_the_failed_tokens_are_never_served, {"scheduling": "sync"},
     "LoadErrorsUnreportedConnector"),
    (tier.TestK23PendingHitResolves().test_a_deferred_lookup_on_a_failed_store_ends_in_a_miss, {},
     "FailedStoreVisibleConnector"),
    (tier.TestK28FailedStoreStaysInvisible().test_no_hit_from_a_failed_store, {"scheduling": "sync"},
     "FailedStoreVisibleConnector"),
    (finish.TestK02FinishHookAndReset().test_reset_between_finish_and_completion_forgets_a, {"scheduling": "sync"},
     "ResetKeepsFinishedConnector"),
    (finish.TestK05EveryStoredChunkIsServed().test_the_whole_prompt_comes_back, {"scheduling": "sync"},
     "NeverServesConnector"),
    (lifecycle.TestK10NoLoadWhileStoresAreInFlight().test_the_lookup_waits_then_loads, {},
     "LoadsWhileStoringConnector"),
    (lifecycle.TestK09PreemptedStoresAreFlushed().test_preemption_waits_for_the_victims_stores,
     {"scheduling": "sync"}, "FenceRemovedConnector"),
    (lifecycle.TestK11CursorAfterPreemption().test_preempted_spec_decode_requests_store_everything, {},
     "PreemptedBlocksKeptConnector"),
    (tier.TestK25AllocationFailure().test_b_retries_until_it_stores, {"scheduling": "sync"},
     "FailedAllocationSkippedConnector"),
    (hybrid.TestK14StaleWindowBlockIsNotStored().test_the_reused_window_block_is_never_stored, {},
     "StaleWindowBlocksConnector"),
    (hybrid.TestK14WindowBlockFencedWhileItsStoreWaits().test_the_schedule_that_reuses_a_window_block_flushes_its_store,
     {}, "UnfencedWindowConnector"),
    # K13: the reference with vLLM's early return restored (an allocation with no external tokens
    # not recorded), beside the remote-prefill peer; no request: it is not the stock connector
    (composed.TestK13MultiConnectorFence().test_a_block_another_connector_loads_into_is_fenced, {"request": None},
     "UnfencedAllocationsConnector"),
]


# K11's, K14's (a window's stale block, fixed in vLLM 0.23.0; its unfenced block) and K25's gates pass for every
# release, preset and fix flag (tests/gates/README.md), and K13's fails only for stock (an expected failure), so
# their plants alone fail them: the same replay against the reference runs beside each, to show
# that the one rule each plant changes is what fails the story.
CONTROLLED = [(gate, arguments) for gate, arguments, planted in PLANTED
              if planted in ("PreemptedBlocksKeptConnector", "FailedAllocationSkippedConnector",
                             "StaleWindowBlocksConnector", "UnfencedWindowConnector", "UnfencedAllocationsConnector")]


@pytest.mark.parametrize("gate, arguments, planted", PLANTED,
                         ids=[f"{gate.__qualname__.split('.')[0]}-{planted}" for gate, _, planted in PLANTED])
def test_the_gate_fails_against_the_connector_that_ships_its_bug(gate, arguments, planted, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(AssertionError):
        gate(GateConnector(f"broken_connector:{planted}", None), **arguments)


@pytest.mark.parametrize("gate, arguments", CONTROLLED, ids=[gate.__qualname__.split(".")[0] for gate, _ in CONTROLLED])
def test_the_same_story_passes_against_the_reference(gate, arguments):
    gate(GateConnector("reference", None), **arguments)
