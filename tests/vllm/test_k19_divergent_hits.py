"""K19's gate (``kvoffload.gates``, ``TestK19DivergentLocalHitsOfAHybrid``) in vLLM's scheduler:
where the GPU keeps a prefix's attention but lost its Mamba state, which hit each connector is
told, that vLLM's stock connector and the reference serve it right either way, and that a
connector told the deeper attention hit and loading no state for it fails the gate.

vLLM 0.27 hands every connector the per-group (divergent) hit; 0.28+ only a connector whose
``supports_divergent_local_hybrid_hits`` is true (``scheduler.py`` ``_get_local_prefix_cache_hit``,
``kv_cache_manager.py`` ``get_computed_blocks_for_connector``); the scheduler reconciles to the
hit every group agrees on when such a connector finds nothing to add.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector  # noqa: E402

from hybrid_gate import run_kept  # noqa: E402
from kvoffload.vllm.build import REFERENCE, STOCK  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402

pytestmark = pytest.mark.vllm

OPT_IN_READ = pytest.mark.skipif(RELEASE < (0, 28, 0), reason="vLLM 0.28 reads the connector's opt-in")
REFERENCE_HERE = pytest.mark.skipif(RELEASE < (0, 29, 0), reason="the reference needs vLLM 0.29's boundary states")


def run_gate(source: str, monkeypatch):
    """The gate's story, its record and replay kept."""
    return run_kept("TestK19DivergentLocalHitsOfAHybrid",
                    "test_a_hit_the_groups_disagree_on_resumes_from_the_state_it_serves", source, monkeypatch)


def opt_in(monkeypatch, connector_class) -> None:
    monkeypatch.setattr(connector_class, "supports_divergent_local_hybrid_hits", True, raising=False)


@OPT_IN_READ
def test_a_connector_that_does_not_opt_in_is_told_the_hit_every_group_agrees_on(monkeypatch):
    """No Mamba state on the GPU, so no local hit at all: the stock connector serves all 64 tokens
    (four attention chunks and the state at 64) from the CPU tier."""
    record, built = run_gate(STOCK, monkeypatch)
    assert built.ledger.first_admission["B"] == (0, 64)
    assert built.checked_load_tokens == 64


def test_a_connector_told_the_deeper_attention_hit_loads_the_rest_and_the_state(monkeypatch):
    """The stock connector opted in (0.27 tells it anyway): 48 tokens stay on the GPU, the tier
    adds chunk 3 and the Mamba state at 64, which the oracle finds holding those 64 tokens."""
    opt_in(monkeypatch, OffloadingConnector)
    record, built = run_gate(STOCK, monkeypatch)
    if RELEASE >= (0, 27, 0):
        assert built.ledger.first_admission["B"] == (48, 16)
    assert record.problems() == []


@REFERENCE_HERE
@pytest.mark.parametrize("opted_in", [False, True])
def test_the_reference_serves_the_divergent_hit_whether_or_not_it_opts_in(opted_in, monkeypatch):
    from kvoffload.vllm.connector import KVOffloadConnector

    if opted_in:
        opt_in(monkeypatch, KVOffloadConnector)
    record, built = run_gate(REFERENCE, monkeypatch)
    assert built.ledger.first_admission["B"] == ((48, 16) if opted_in else (0, 64))


def loads_no_mamba_state(monkeypatch) -> None:
    """The stock connector's load sees only nulls in the Mamba group, qwen3-next's second (a
    connector that loads the attention past a divergent local hit and leaves the lagging state
    to the GPU)."""
    scheduler_class = sys.modules[OffloadingConnector.__module__].OffloadingConnectorScheduler
    plain = scheduler_class.update_state_after_alloc

    def attention_only(self, request, blocks, num_external_tokens):
        attention, mamba = blocks.blocks
        null = next(block for block in mamba if block.is_null)  # the row's padding before its state
        return plain(self, request, type(blocks)((attention, [null] * len(mamba))), num_external_tokens)
    monkeypatch.setattr(scheduler_class, "update_state_after_alloc", attention_only)


@pytest.mark.skipif(RELEASE < (0, 27, 0), reason="vLLM 0.27 is the first to hand a connector a divergent hit")
def test_the_gate_fails_a_connector_that_loads_no_state_for_the_divergent_hit(monkeypatch):
    """Planted: opted in, the stock connector claims chunk 3 and loads only its attention; B
    resumes at 64 from a Mamba block nobody wrote: one poisoned state, group 1, chunk 3."""
    opt_in(monkeypatch, OffloadingConnector)
    loads_no_mamba_state(monkeypatch)
    with pytest.raises(AssertionError, match="1 poisoned load: B .* chunk 3"):
        run_gate(STOCK, monkeypatch)
