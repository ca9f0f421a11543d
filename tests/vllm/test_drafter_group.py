"""A drafter (MTP) KV cache group of its own (``qwen3-next-mtp``: full attention, Mamba, and the
drafter's full attention flagged ``is_eagle_group``; engine/drafter_kv.py, vllm/drafter_group.py)
in vLLM 0.32's scheduler beside the simulator, on the story of tests/gates/test_k17_drafter_group.py:
B (P + 6), then C sharing B's first ``shared`` tokens and differing at the next, after the GPU
cache forgot B. The replay's fake worker writes the drafter's slots one token ahead
(``DrafterCells``), as the simulator's oracle does."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as offloading_scheduler  # noqa: E402

from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.engine.engine import Engine  # noqa: E402
from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402
from kvoffload.gates.story import replay  # noqa: E402
from kvoffload.vllm.build import REFERENCE, STOCK  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(RELEASE < (0, 32, 0), reason="the engine's rules are vLLM 0.32's")]

CONFIG = EngineConfig(model="qwen3-next-mtp", block_size=16, gpu_blocks=64, cpu_chunks=64, max_num_seqs=8,
                      max_num_batched_tokens=16, eagle_drafts=1, prefix_cache_retention_interval=None)
P = tuple(range(1000, 1064))


def requests(shared: int) -> list[RequestSpec]:
    return [RequestSpec("B", P + tuple(range(5000, 5006)), tuple(range(2000, 2004))),
            RequestSpec("C", P[:shared] + tuple(range(7000, 7068 - shared)), tuple(range(3000, 3004)),
                        arrival_step=12)]


def in_vllm(source: str, shared: int, scheduling: str):
    """vLLM's scheduler: C's first admission (GPU, connector), the poisoned loads, the replay."""
    record, built = replay(GateConnector(source, None), requests(shared), CONFIG.replace(scheduling=scheduling),
                           forget_gpu_cache_before=(12,))
    return built.ledger.first_admission["C"], poisoned(record), built


def in_the_simulator(shared: int, scheduling: str, connector_class=None):
    engines: list[Engine] = []

    def forget(next_step: int, finished: int) -> None:
        if next_step == 12:
            engines[0].pool.uncache_free_blocks()

    config = CONFIG.replace(scheduling=scheduling)
    engines.append(Engine(requests(shared), config, max_steps=200, on_step=forget, skip_idle=False))
    if connector_class is not None:
        engines[0].connector = engines[0].scheduler.connector = connector_class(config.connector_config(),
                                                                                engines[0].fixes)
    record = engines[0].run()
    return (record.gpu_hit_tokens, record.connector_hit_tokens_admitted), poisoned(record)


def poisoned(record) -> list[tuple[str, int, int, int]]:
    return [(p.req_id, p.chunk, p.bad_slots, p.group) for p in record.poisoned]


def test_vllm_looks_both_full_attention_groups_up_together():
    """The drafter's group is flagged and the coordinator's one drafter group; the two
    full-attention groups share a spec, so one lookup (``SpecGroup``) that drops for both."""
    _, _, built = in_vllm(REFERENCE, 32, "sync")
    config = built.scheduler.kv_cache_config
    assert [(type(g.kv_cache_spec).__name__, g.is_eagle_group) for g in config.kv_cache_groups] == \
        [("FullAttentionSpec", False), ("MambaSpec", False), ("FullAttentionSpec", True)]
    coordinator = built.scheduler.kv_cache_manager.coordinator
    assert coordinator.eagle_group_ids == {2}
    assert [(g.group_ids, g.use_eagle) for g in coordinator.attention_groups] == [([0, 2], True), ([1], False)]


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("shared, served", [(32, 16), (64, 48)])
def test_both_engines_serve_c_a_chunk_short_of_its_divergence(scheduling, shared, served):
    """The reference and vLLM's stock connector in vLLM's scheduler, the reference in the
    simulator: C gets 0 from the GPU and ``served`` from the tier, clean (B gets no hit)."""
    for source in (REFERENCE, STOCK):
        admission, bad, _ = in_vllm(source, shared, scheduling)
        assert (source, admission, bad) == (source, (0, served), [])
    assert in_the_simulator(shared, scheduling) == ((0, served), [])


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_a_drafter_group_looked_up_like_a_target_group_is_poisoned_in_both_engines(scheduling, monkeypatch):
    """Planted: the reference without the drafter lookup's drop (tests/gates/planted.py), in both
    engines, and vLLM's stock connector with its groups' ``is_eagle_group`` cleared after
    ``from_spec``: C is served 32 and loads one poisoned drafter slot (group 2, chunk 1)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "gates"))
    from planted import UndroppedDrafterLookupScheduler

    expected = [("C", 1, 1, 2)]
    assert in_the_simulator(32, scheduling, UndroppedDrafterLookupScheduler) == ((0, 32), expected)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    admission, bad, _ = in_vllm("broken_connector:UndroppedDrafterLookupConnector", 32, scheduling)
    assert (admission, bad) == ((0, 32), expected)

    config_class = offloading_scheduler.SchedulerOffloadConfig
    plain = config_class.from_spec.__func__

    def unflagged(cls, *args, **kwargs):
        config = plain(cls, *args, **kwargs)
        return config._replace(kv_group_configs=tuple(g._replace(is_eagle_group=False)
                                                      for g in config.kv_group_configs))
    monkeypatch.setattr(config_class, "from_spec", classmethod(unflagged))
    admission, bad, _ = in_vllm(STOCK, 32, scheduling)
    assert (admission, bad) == ((0, 32), expected)
