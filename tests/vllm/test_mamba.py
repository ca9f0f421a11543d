"""A Mamba group (align mode) in vLLM's scheduler: the qwen3-next model built for vLLM 0.25+
(``vllm/build.py``; 0.25-0.26's connectors get a Mamba layer as state tensors,
``vllm/compat/v0_27.py``), its stock connector loading one Mamba state from the CPU tier, and the
KV content oracle's check of a restored state (``vllm/model.py``, ``StateCells``) on K18's story.

Block size 16, one block per chunk, 64 GPU blocks, a 64-token budget: a 64-token prompt is one
prefill step, and the state after ``16 k`` tokens sits in the row's block ``k - 1``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from kvoffload.core.types import ConfigError  # noqa: E402
from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates.story import forget_free_blocks  # noqa: E402
from kvoffload.vllm import build  # noqa: E402
from kvoffload.vllm.build import REFERENCE, STOCK, ConnectorLoad  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402

pytestmark = pytest.mark.vllm

# The reference (no preset) stores Mamba states from the scheduler's boundary-state hand-off (vLLM 0.29+) and
# refuses older releases in one line (test_before_029_the_reference_refuses_a_mamba_group).
REFERENCE_HERE = pytest.mark.skipif(RELEASE < (0, 29, 0), reason="the reference needs vLLM 0.29's boundary states")
REFERENCE_CASE = pytest.param(REFERENCE, marks=REFERENCE_HERE)

QWEN = EngineConfig(model="qwen3-next", gpu_blocks=64, cpu_chunks=64, block_size=16, max_num_seqs=8,
                    max_num_batched_tokens=64)
PROMPT = tuple(range(1000, 1070))  # 70 tokens: four full blocks and six more


def answer(seed: int) -> tuple[int, ...]:
    return tuple(range(seed, seed + 4))


def replay(requests, *, forget_before: int, scheduling: str = "sync", plant=None, connector: str = STOCK):
    """The record and the replay of ``requests`` with ``connector`` (vLLM's stock one by default);
    vLLM's GPU prefix cache drops every free block before step ``forget_before`` (only the CPU
    tier can serve them)."""
    from kvoffload.vllm.replay import VllmSchedulerReplay

    built = []

    def on_step(next_step: int, finished: int) -> None:
        if next_step == forget_before:
            forget_free_blocks(built[0].scheduler.kv_cache_manager.block_pool)

    built.append(VllmSchedulerReplay(requests, QWEN.replace(scheduling=scheduling), ConnectorLoad(connector),
                                     transfer="threaded", on_step=on_step, max_steps=100))
    if plant is not None:
        plant(built[0].scheduler.connector.connector_scheduler)
    return built[0].run(), built[0]


def test_the_mamba_group_is_built_in_align_mode_for_the_scheduler_and_the_stock_connector():
    """vLLM's own config, layout and scheduler take the group: equal pages (``mamba_spec``), the
    hybrid coordinator with a MambaManager, the aligned prefill split on, and the stock
    connector's view of the group: a window of one chunk, from 0.28 of copy-on-write sources
    (``requires_cow_source``; 0.29+ store it only from the scheduler's boundary-state hand-off,
    0.25-0.28 from the block table like a window, 0.25.0 ``offloading/scheduler.py``
    ``_build_store_jobs``)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    load = ConnectorLoad(STOCK)
    config = build.build_vllm_config(QWEN, load.transfer_config(QWEN, "threaded"), 512, load)
    assert config.cache_config.mamba_cache_mode == "align"
    kv_cache_config = build.build_kv_cache_config(config, QWEN)
    assert kv_cache_config.has_mamba_layers and kv_cache_config.num_blocks == 64
    specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
    assert [type(spec) for spec in specs] == [FullAttentionSpec, MambaSpec]
    assert specs[1].page_size_bytes == specs[0].page_size_bytes  # one pool, one page size
    assert specs[1].max_memory_usage_bytes(config) == 2 * specs[1].page_size_bytes  # running + previous
    scheduler = build.build_scheduler(config, kv_cache_config)
    try:
        coordinator = scheduler.kv_cache_manager.coordinator
        assert type(coordinator).__name__ == "HybridKVCacheCoordinator"
        assert [type(m).__name__ for m in coordinator.single_type_managers] == ["FullAttentionManager", "MambaManager"]
        assert scheduler.need_mamba_block_aligned_split
        connector = scheduler.connector.connector_scheduler
        mamba = connector.config.kv_group_configs[1]
        # 0.25 counts the window in GPU blocks, one per chunk here
        window = getattr(mamba, "sliding_window_size_in_chunks", None) or mamba.sliding_window_size_in_blocks
        assert window == 1
        assert getattr(mamba, "requires_cow_source", False) == (RELEASE >= (0, 28, 0))
        assert connector._mamba_align_size == 16
    finally:
        scheduler.shutdown()


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_n_gram_drafts_give_the_mamba_group_a_state_block_per_draft_token(scheduling):
    """vLLM gives a Mamba layer's spec ``num_speculative_blocks`` = the draft tokens whatever the
    drafter (``MambaBase.get_kv_cache_spec`` reads ``VllmConfig.num_speculative_tokens``, which
    n-gram sets): the build does the same, and vLLM's scheduler takes them."""
    engine = QWEN.replace(spec_tokens=3, scheduling=scheduling)
    config = build.build_vllm_config(engine, ConnectorLoad(REFERENCE).transfer_config(engine, "stepped"), 256)
    # ``method``, not ``use_ngram()``, which 0.25-0.26's SpeculativeConfig lacks (async
    # scheduling takes "ngram_gpu" in 0.32)
    assert config.speculative_config.method in ("ngram", "ngram_gpu") and config.num_speculative_tokens == 3
    mamba = build.kv_cache_groups(engine)[1].kv_cache_spec
    assert type(mamba).__name__ == "MambaSpec" and mamba.num_speculative_blocks == 3
    assert build.kv_cache_groups(QWEN)[1].kv_cache_spec.num_speculative_blocks == 0


def test_a_connector_without_the_hybrid_manager_is_refused():
    with pytest.raises(ConfigError, match="needs vLLM's hybrid KV cache manager.*Mamba"):
        build.kv_cache_groups(QWEN, hybrid_manager=False)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("connector", [STOCK, REFERENCE_CASE])
def test_the_connector_loads_one_mamba_state_from_the_cpu_tier(scheduling, connector):
    """A (70 tokens) caches and stores the state at 64, its replay boundary; B (A's prompt + 20)
    stores the state at 80; after the GPU forgets them, C (A's prompt + 20 others) loads 64
    tokens: four full-attention blocks and the Mamba state at 64, which the oracle finds holding
    exactly those 64 tokens. vLLM's stock connector and the reference alike (each stores a
    state from the scheduler's boundary-state hand-off, one job per state)."""
    requests = [RequestSpec("A", PROMPT, answer(2000)),
                RequestSpec("B", PROMPT + tuple(range(5000, 5020)), answer(2100), arrival_step=10),
                RequestSpec("C", PROMPT + tuple(range(6000, 6020)), answer(2200), arrival_step=20)]
    record, built = replay(requests, forget_before=20, scheduling=scheduling, connector=connector)
    assert record.problems() == [] and record.finished_requests == 3
    assert built.ledger.first_admission["C"] == (0, 64)  # no GPU hit, 64 tokens from the CPU tier
    assert built.checked_load_tokens == 64


K18_P = tuple(range(1000, 1064))  # 64 tokens: four blocks exactly


def k18_story(scheduling: str, plant=None, connector: str = STOCK):
    """K18 (vLLM #44599): B = P + 6 tokens stores the state at 64 (its replay boundary); after the
    GPU forgets it, C = P exactly. A hit of all of P would leave no token to compute, so the
    lookup asks for 63 at most, and a Mamba hit must end on a state the tier holds: 63 rounded
    down to the chunk is 48, never stored, so no hit. Without the round-down the tier offers 63
    tokens and the state at 64: C resumes at token 63 with its last token already applied."""
    requests = [RequestSpec("B", K18_P + tuple(range(5000, 5006)), answer(2000)),
                RequestSpec("C", K18_P, answer(2100), arrival_step=12)]
    return replay(requests, forget_before=12, scheduling=scheduling, plant=plant, connector=connector)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("connector", [STOCK, REFERENCE_CASE])
def test_k18_the_connector_rounds_the_mamba_hit_down_and_loads_no_stale_state(scheduling, connector):
    record, built = k18_story(scheduling, connector=connector)
    assert record.problems() == [] and record.finished_requests == 2
    assert built.ledger.first_admission["C"] == (0, 0)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_k18_planted_without_the_round_down_the_oracle_reports_the_stale_mamba_state(scheduling):
    """The stock connector with its Mamba alignment removed on the live instance (what
    ``_lookup_complete_chunks`` rounds the bound down to): the load of 63 tokens restores the
    state of 64, one poisoned state in group 1, chunk 3."""
    def without_round_down(connector_scheduler):
        connector_scheduler._mamba_align_size = None

    record, built = k18_story(scheduling, plant=without_round_down)
    assert built.ledger.first_admission["C"] == (0, 63)
    assert [(p.req_id, p.group, p.chunk, p.bad_slots) for p in record.poisoned] == [("C", 1, 3, 1)]


def test_k18_gate_passes_for_the_stock_connector_and_fails_with_its_round_down_removed(monkeypatch):
    """The packaged gate (``kvoffload.gates``, any connector): the stock connector passes; with its
    Mamba alignment gone (``resolve_mamba_align_size``, which the stock scheduler reads once at
    construction for ``_lookup_complete_chunks``) the gate fails on the poisoned Mamba state."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as stock_scheduler

    from kvoffload.gates.plugin import GateConnector
    from kvoffload.gates.test_k14_k19_hybrid import TestK18MambaStateAtABoundary

    gate = TestK18MambaStateAtABoundary().test_an_exact_resend_never_resumes_from_a_later_state
    gate(GateConnector(STOCK, None))
    monkeypatch.setattr(stock_scheduler, "resolve_mamba_align_size", lambda *args, **kwargs: None)
    with pytest.raises(AssertionError, match="1 poisoned"):
        gate(GateConnector(STOCK, None))


@REFERENCE_HERE
@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_k18_planted_the_reference_without_its_round_down_loads_the_stale_mamba_state(scheduling, monkeypatch):
    """The reference's bound only one token short of the request, as for a window alone (no fix
    flag: every release modelled rounds down): C is served 63 tokens with the state of 64, one
    poisoned state in group 1, chunk 3, as with vLLM's planted stock connector above."""
    from kvoffload.core.hybrid import HybridConnectorScheduler

    monkeypatch.setattr(HybridConnectorScheduler, "_lookup_bound", lambda self, req: req.num_tokens - 1)
    record, built = k18_story(scheduling, connector=REFERENCE)
    assert built.ledger.first_admission["C"] == (0, 63)
    assert [(p.req_id, p.group, p.chunk, p.bad_slots) for p in record.poisoned] == [("C", 1, 3, 1)]


@REFERENCE_HERE
def test_k18_gate_passes_for_the_reference_and_fails_with_its_round_down_removed(monkeypatch):
    """The packaged gate against the reference connector (``--connector reference``): it passes;
    with the round-down gone (``HybridConnectorScheduler._lookup_bound``) it fails on the
    poisoned Mamba state."""
    from kvoffload.core.hybrid import HybridConnectorScheduler
    from kvoffload.gates.plugin import GateConnector
    from kvoffload.gates.test_k14_k19_hybrid import TestK18MambaStateAtABoundary

    gate = TestK18MambaStateAtABoundary().test_an_exact_resend_never_resumes_from_a_later_state
    gate(GateConnector(REFERENCE, None))
    monkeypatch.setattr(HybridConnectorScheduler, "_lookup_bound", lambda self, req: req.num_tokens - 1)
    with pytest.raises(AssertionError, match="1 poisoned"):
        gate(GateConnector(REFERENCE, None))


@pytest.mark.skipif(RELEASE >= (0, 29, 0), reason="vLLM 0.29+ hand the reference its boundary states")
def test_before_029_the_reference_refuses_a_mamba_group_in_one_line():
    """0.25-0.28's schedulers hand a connector no boundary states: the reference would store no
    Mamba state and serve nothing, so it says so instead (and the K18 gate skips with this line)."""
    with pytest.raises(ConfigError, match=r"^KVOffloadConnector: model 'qwen3-next': vLLM 0\.2[5-8]\.\d's scheduler hands"):
        k18_story("sync", connector=REFERENCE)


def test_the_stock_worker_lays_a_groups_blocks_one_after_another_as_vllms_does():
    """vLLM's worker (``transfer_async``, cpu/gpu_worker.py) lays each group's blocks one after
    another from ``block_indices[g] % blocks_per_chunk``: two Mamba states of one 0.25 store job
    from sub-block 1 put the second in sub-block 0 of its chunk (docs/hybrid.md, "The releases");
    blocks that fill fewer chunks than the job's slots fail the worker's own assertion."""
    from vllm.v1.kv_offload.base import GPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    from kvoffload.core.types import TransferKind
    from kvoffload.vllm.stock import HandlerOffloadingWorker

    worker = HandlerOffloadingWorker(None, 2)
    gpu = GPULoadStoreSpec([1, 2, 3, 4, 6, 9], group_sizes=[4, 2], block_indices=[0, 1])
    job = worker._job(7, TransferKind.STORE, gpu, CPULoadStoreSpec([10, 11, 12, 13]))
    assert job.chunk_groups == (0, 0, 1, 1) and job.chunk_slots == (10, 11, 12, 13)
    assert job.chunk_skips == (0, 0, 1, 0) and job.chunk_counts == (2, 2, 1, 1)
    with pytest.raises(AssertionError, match="job 7: its groups' blocks fill 4 chunks, 5 given"):
        worker._job(7, TransferKind.STORE, gpu, CPULoadStoreSpec([10, 11, 12, 13, 14]))


@pytest.mark.skipif(not (0, 25, 0) <= RELEASE < (0, 29, 0), reason="the presets of 0.25-0.28 in their releases")
@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_the_releases_preset_stores_a_mamba_group_as_its_stock_connector(scheduling):
    """In 0.25-0.28's own schedulers the reference with the release's preset
    (``MambaStores.BLOCK_TABLE``: vllm-0.25, vllm-0.26, vllm-0.28) admits, serves and finishes
    every request of qwen3-next-multi-turn-small as the stock connector, every metric alike but
    the timings (0.26.0 crashing at the same step, #49118): the release table's second pass."""
    import vllm

    from kvoffload.releases import PRESET_OF
    from kvoffload.vllm.rows import release_row

    stock = release_row("qwen3-next-multi-turn-small", scheduling)
    ours = release_row("qwen3-next-multi-turn-small", scheduling, preset=PRESET_OF[vllm.__version__])
    assert ours["first_admission"] == stock["first_admission"] and ours["steps"] == stock["steps"]
    timings = {"connector_us_per_step", "copy_gb_per_s", "sim_requests_per_s"}
    assert {k: ours["metrics"][k] for k in stock["metrics"] if k not in timings} == \
           {k: v for k, v in stock["metrics"].items() if k not in timings}
    assert stock["metrics"]["offload_hit_rate"] > 0.2
    assert (ours["error"] is None) == (stock["error"] is None) and (ours["error"] or {}).get("step") == \
           (stock["error"] or {}).get("step")
