"""K17's gate (``kvoffload.gates``, ``TestK17DrafterGroupsOnHybrids``) in vLLM's scheduler: a
hybrid model with an EAGLE/MTP drafter and no KV cache group flagged a drafter. vLLM 0.25-0.29's
offloading connector then took every group for a drafter (``SchedulerOffloadConfig.from_spec``,
vLLM #52735); 0.30 takes none (PRs #52771, #52807). A drafter group drops its trailing chunk from
a lookup, and the Mamba group's servable window is one chunk: no hit at all.

The plants flag the connector's groups after ``from_spec`` (the lookup and the store read only
``GroupOffloadConfig.is_eagle_group``): every group, as the old fallback did, or none, as the fix
does, so the gate's 0 is pinned on the flags in every release that runs the story.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as offloading_scheduler  # noqa: E402

from hybrid_gate import run_kept  # noqa: E402
from kvoffload.vllm.build import REFERENCE, STOCK  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402

pytestmark = pytest.mark.vllm

FIXED = RELEASE >= (0, 30, 0)
SERVED_NOTHING = r"served 0 from the GPU cache \+ 0 from the connector"


def run_gate(source: str, monkeypatch):
    """The gate's story, its record and replay kept."""
    return run_kept("TestK17DrafterGroupsOnHybrids",
                    "test_a_drafter_config_leaves_the_mamba_group_its_hit", source, monkeypatch)


def drafter_groups(monkeypatch, every: bool) -> None:
    """The stock connector's groups all flagged drafters (``every``: the fallback of 0.25-0.29)
    or none (the fix of 0.30), whatever the release decided."""
    config_class = offloading_scheduler.SchedulerOffloadConfig
    plain = config_class.from_spec.__func__

    def flagged(cls, *args, **kwargs):
        config = plain(cls, *args, **kwargs)
        groups = tuple(group._replace(is_eagle_group=every) for group in config.kv_group_configs)
        # a partial tail is refused beside a drafter group (0.31+), as the fallback refused it
        tail = {"supports_partial_tail": False} if every and "supports_partial_tail" in config._fields else {}
        return config._replace(kv_group_configs=groups, **tail)
    monkeypatch.setattr(config_class, "from_spec", classmethod(flagged))


@pytest.mark.parametrize("drafter", [False, True])
def test_the_connector_is_told_a_drafter_and_no_drafter_group(drafter):
    """What the story hands vLLM: an EAGLE speculative config, the target's two groups, none
    flagged, the Mamba group a speculative state block for its one draft token. Without the
    drafter, the build of every other replay: no speculative config, no speculative block."""
    from kvoffload.gates.test_k14_k19_hybrid import MAMBA
    from kvoffload.vllm.build import ConnectorLoad, build_kv_cache_config, build_vllm_config

    load, engine = ConnectorLoad(STOCK), MAMBA.replace(eagle_drafts=int(drafter))
    config = build_vllm_config(engine, load.transfer_config(engine, "stepped"), 128, load)
    groups = build_kv_cache_config(config, engine).kv_cache_groups
    assert (config.speculative_config is not None and config.speculative_config.use_eagle()) is drafter
    assert [type(g.kv_cache_spec).__name__ for g in groups] == ["FullAttentionSpec", "MambaSpec"]
    assert not any(g.is_eagle_group for g in groups)
    assert groups[1].kv_cache_spec.num_speculative_blocks == int(drafter)


@pytest.mark.skipif(not FIXED, reason="vLLM 0.30 is the first release that takes no group for a drafter")
def test_the_stock_connector_serves_the_state_the_scheduler_checkpointed(monkeypatch):
    """Attention chunks 0-2 and the Mamba state at 48, all from the CPU tier, clean."""
    record, built = run_gate(STOCK, monkeypatch)
    assert built.ledger.first_admission["C"] == (0, 48)
    assert [g.is_eagle_group for g in built.scheduler.connector.connector_scheduler.config.kv_group_configs] == \
        [False, False]
    assert record.problems() == []


def test_the_gate_fails_a_connector_that_takes_every_group_for_a_drafter(monkeypatch):
    """0.25-0.29 as released; 0.30+ with the fallback planted back: 0 tokens served."""
    if FIXED:
        drafter_groups(monkeypatch, every=True)
    with pytest.raises(AssertionError, match=SERVED_NOTHING):
        run_gate(STOCK, monkeypatch)


@pytest.mark.skipif(RELEASE[:2] == (0, 29), reason="vLLM 0.29's scheduler offers no Mamba boundary state under "
                    "EAGLE (take_boundary_state_offloads is empty after B caches 48 tokens; 0.30 offers the state "
                    "at 48), and 0.29's connector stores a state only from that offer: nothing to serve")
def test_the_drafter_flags_alone_cost_the_hit(monkeypatch):
    """The fix planted into any release (no group a drafter): the stock connector serves 48."""
    drafter_groups(monkeypatch, every=False)
    record, built = run_gate(STOCK, monkeypatch)
    assert built.ledger.first_admission["C"] == (0, 48)


@pytest.mark.skipif(not FIXED, reason="the reference runs a Mamba group from vLLM 0.29, where the scheduler "
                    "offers it no state under EAGLE")
def test_the_reference_serves_the_hit(monkeypatch):
    record, built = run_gate(REFERENCE, monkeypatch)
    assert built.ledger.first_admission["C"] == (0, 48)


@pytest.mark.skipif(not FIXED, reason="the reference runs K17 from vLLM 0.30 (0.29's scheduler offers no state "
                    "under EAGLE)")
@pytest.mark.parametrize("preset, served", [(None, 48), ("vllm-0.30", 48), ("vllm-0.29", 0), ("vllm-0.25", 0)])
def test_the_simulator_tells_the_same_story(preset, served, monkeypatch):
    """Differential: K17's story in vLLM's scheduler and in the engine (``eagle_drafts``), the
    reference or a preset on both: C's first admission (GPU hit, connector hit) agrees, 48 from
    the tier where no group is a drafter's, 0 where every group is (tests/gates, K17)."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.engine.engine import Engine
    from kvoffload.gates import test_k14_k19_hybrid as gates
    from kvoffload.gates.plugin import GateConnector

    kept = []
    plain = gates.replay

    def keeping(kv_connector, requests, config, **kwargs):
        kept.append((requests, config, kwargs["forget_gpu_cache_before"], plain(kv_connector, requests, config, **kwargs)))
        return kept[-1][-1]
    monkeypatch.setattr(gates, "replay", keeping)
    story = gates.TestK17DrafterGroupsOnHybrids().test_a_drafter_config_leaves_the_mamba_group_its_hit
    try:
        story(GateConnector(REFERENCE, preset))
    except AssertionError:
        assert served == 0  # the gate fails where the connector serves nothing
    requests, config, (forget,), (record, built) = kept[0]
    engines: list[Engine] = []

    def forget_cache(next_step: int, finished: int) -> None:
        if next_step == forget:
            engines[0].pool.uncache_free_blocks()
    engines.append(Engine(requests, config, Fixes.preset(preset) if preset else Fixes(), on_step=forget_cache,
                          skip_idle=False, max_steps=200))
    simulated = engines[0].run()
    assert built.ledger.first_admission["C"] == (0, served)
    assert (simulated.gpu_hit_tokens, simulated.connector_hit_tokens_admitted) == (0, served)
    assert record.problems() == [] and simulated.poisoned == []
