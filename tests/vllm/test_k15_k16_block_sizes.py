"""K15's and K16's gates (``kvoffload.gates``, ``TestK15SlidingWindowHorizon``,
``TestK16UnalignedSlidingWindowLoad``) in vLLM's scheduler, on groups of different block sizes.

K16, ``mixed-blocks-tiny`` (full attention of 6-token blocks, a 4-token window of 4-token blocks):
a load ending at 6 spans window blocks 0 and 1; vLLM 0.25-0.26 bounded a load's pending window
blocks by the window in chunks times blocks per chunk (one), an ``AssertionError`` in
``update_state_after_alloc`` (vLLM #48959); 0.27 allows one block more (PR #49052). The plant puts
the old bound back in front of a fixed release's ``update_state_after_alloc``, counting the
pending blocks as it does, so the gate's failure is pinned on the bound in every release.

K15, ``nested-blocks-tiny`` (12-token blocks, an 8-token window of 4-token blocks): what a
chunked prefill of 40 tokens, 8 a step, submits of the window group in each release; its plant
gives 0.30+'s store mask each step's frontier for the final segment's end, as 0.27-0.29 did.

The reference connector runs both stories in vLLM's scheduler as vLLM 0.32's connector does (each
group chunked at its own block size, ``core/keys.py``): the same load ends, the same window chunks
stored; the old bound and the frontier horizon planted into it fail the gates as in vLLM. Its
presets follow their releases: ``vllm-0.25`` and ``vllm-0.26`` fail K16 and pass K15 (0.25-0.26's
bound and segment tails, ``ReleaseRules``), ``vllm-0.29`` fails K15 and passes K16.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from kvoffload.core.types import ConfigError, cdiv  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402
from kvoffload.vllm.build import REFERENCE, STOCK, ConnectorLoad  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402

pytestmark = pytest.mark.vllm

FIXED = RELEASE >= (0, 27, 0)
# K15: the window chunks each release stores of C's chunked prefill (vLLM 0.25-0.26: a segment's
# tails only, not the prompt's; 0.27-0.29: every step's frontier taken for the prompt's end too;
# 0.30+: the segments' and the prompt's tails, vLLM #54362).
HORIZON_STORES = ({1, 2, 4, 5, 7, 8} if RELEASE < (0, 27, 0) else set(range(10)) if RELEASE < (0, 30, 0)
                  else {1, 2, 4, 5, 7, 8, 9})
# The reference reads the story's dense retention from vLLM's CacheConfig, which has the setting
# from 0.29 (vllm/build.py); before, it takes 0.32's default, 0, and stores only the window before
# the prompt's last token (chunks 7 and 8), no segment's tail, so no horizon is drawn.
DENSE_RETENTION = RELEASE >= (0, 29, 0)


def run_gate(source: str, preset: str | None = None) -> None:
    """K16's story against ``source`` (imported here: pytest would collect its class)."""
    from kvoffload.gates.test_k15_k16_block_sizes import TestK16UnalignedSlidingWindowLoad

    TestK16UnalignedSlidingWindowLoad().test_every_load_of_a_stored_prompt_is_admitted(GateConnector(source, preset))


def run_k15(source: str, preset: str | None = None) -> None:
    from kvoffload.gates.test_k15_k16_block_sizes import TestK15SlidingWindowHorizon

    TestK15SlidingWindowHorizon().test_a_chunked_prefill_stores_only_window_chunks_a_hit_can_read(
        GateConnector(source, preset))


def plant_the_old_bound(monkeypatch) -> None:
    """vLLM 0.25-0.26's bound on a load's pending window blocks (no block more), checked before
    the release's own ``update_state_after_alloc`` runs."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as offloading

    cls = offloading.OffloadingConnectorScheduler
    plain = cls.update_state_after_alloc

    def old_bound(self, request, blocks, num_external_tokens):
        local = self._req_status[request.request_id].num_locally_computed_tokens
        for group in self.config.kv_group_configs if num_external_tokens else ():
            if group.sliding_window_size_in_chunks is None:
                continue
            table, size = blocks.blocks[group.group_idx], group.tokens_per_block
            end = cdiv(local + num_external_tokens, size)
            first = next((i for i in range(local // size, end) if not table[i].is_null and table[i].block_hash is None),
                         end)
            assert end - first <= group.sliding_window_size_in_chunks * self.config.blocks_per_chunk
        return plain(self, request, blocks, num_external_tokens)
    monkeypatch.setattr(cls, "update_state_after_alloc", old_bound)


def test_vllm_builds_each_group_at_its_own_block_size():
    """The specs, one page for both (the window's padded), and the scheduler aligned to their
    lcm and hashing at their gcd, as ``EngineCore`` sets it up."""
    from kvoffload.gates.test_k15_k16_block_sizes import MIXED
    from kvoffload.vllm.build import build_kv_cache_config, build_vllm_config
    from kvoffload.vllm.group_blocks import scheduler_block_sizes

    load = ConnectorLoad(STOCK)
    config = build_vllm_config(MIXED, load.transfer_config(MIXED, "stepped"), 64, load)
    kv_cache_config = build_kv_cache_config(config, MIXED)
    specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
    assert [(type(s).__name__, s.block_size, getattr(s, "sliding_window", None)) for s in specs] == \
        [("FullAttentionSpec", 6, None), ("SlidingWindowSpec", 4, 4)]
    assert specs[0].page_size_bytes == specs[1].page_size_bytes
    assert kv_cache_config.num_blocks == MIXED.gpu_blocks
    assert scheduler_block_sizes(config, kv_cache_config) == {"block_size": 12, "hash_block_size": 2}
    assert "block_size" not in config.kv_transfer_config.kv_connector_extra_config


def test_a_prompt_of_eight_tokens_loads_six_across_two_window_blocks():
    from kvoffload.gates.test_k15_k16_block_sizes import admit_over_a_stored_prompt

    end, failure = admit_over_a_stored_prompt(GateConnector(STOCK, None), 8)
    assert end == 6
    assert (failure is None) is FIXED, failure
    if not FIXED:
        assert "offloading/scheduler.py" in failure and "(update_state_after_alloc)" in failure


def test_the_gate_fails_the_bound_of_vllm_0_25_and_0_26(monkeypatch):
    """0.25-0.26 as released; 0.27+ with the old bound planted back."""
    if FIXED:
        plant_the_old_bound(monkeypatch)
    with pytest.raises(AssertionError, match=r"^8 admissions crashed vLLM's scheduler: 8 tokens, load ending at 6"):
        run_gate(STOCK)


@pytest.mark.skipif(not FIXED, reason="vLLM 0.27 is the first release whose bound allows the window's block more")
def test_the_stock_connector_admits_every_load():
    run_gate(STOCK)


def test_the_reference_loads_what_vllm_0_32_loads_and_is_admitted():
    """Every prompt's load ends where vLLM 0.32's stock connector's does (``PROMPTS``); none dies."""
    from kvoffload.gates.test_k15_k16_block_sizes import PROMPTS, admit_over_a_stored_prompt

    loads = [admit_over_a_stored_prompt(GateConnector(REFERENCE, None), n) for n in PROMPTS]
    assert [end for end, _ in loads] == [6, 6, 6, 6, 11, 12, 12, 12, 12, 12, 16, 16, 18, 18, 18, 18]
    assert [failure for _, failure in loads] == [None] * len(PROMPTS)
    run_gate(REFERENCE)


def test_the_gate_fails_the_reference_with_the_old_bound(monkeypatch):
    """vLLM 0.25-0.26's bound (no block more, ``ReleaseRules.window_load_spare_block`` off): the
    presets of those releases die where their stock connectors died, the reference's model of
    vLLM's assert firing; 0.29's preset is admitted as 0.27+ are. The plant gives 0.26's preset
    0.27's bound back: it passes, so the rule alone fails it."""
    import dataclasses

    from kvoffload.core.fixes import PRESETS

    for preset in ("vllm-0.25", "vllm-0.26"):
        with pytest.raises(AssertionError, match=r"^8 admissions crashed vLLM's scheduler: 8 tokens, load ending at 6: "
                                                 r"ConnectorCrash at core/hybrid.py:\d+ \(update_state_after_alloc\) "
                                                 r"assert num_pending_gpu_blocks <= window: 'C' group 1 loads 2 blocks\n"):
            run_gate(REFERENCE, preset)
    run_gate(REFERENCE, "vllm-0.29")
    old = PRESETS["vllm-0.26"]
    monkeypatch.setitem(PRESETS, "vllm-0.26", dataclasses.replace(
        old, rules=dataclasses.replace(old.rules, window_load_spare_block=True)))
    run_gate(REFERENCE, "vllm-0.26")


def test_the_reference_refuses_chunks_of_several_blocks_when_block_sizes_differ():
    from kvoffload.gates.test_k15_k16_block_sizes import MIXED, scheduler_alone

    with pytest.raises(pytest.skip.Exception, match=r"block sizes differ \(\[4, 6\]\): a chunk is one block each, "
                                                    r"got blocks_per_chunk=2$"):
        with scheduler_alone(GateConnector(REFERENCE, None), MIXED.replace(blocks_per_chunk=2)):
            pass


def test_stock_chunks_of_several_blocks_are_refused_in_one_line():
    """(The replay runs such groups with its worker: tests/vllm/test_block_grids.py.)"""
    from kvoffload.gates.test_k15_k16_block_sizes import MIXED

    with pytest.raises(ConfigError, match="one block each, got blocks_per_chunk=2$"):
        ConnectorLoad(STOCK).transfer_config(MIXED.replace(blocks_per_chunk=2), "stepped")


def test_each_release_stores_its_window_chunks_of_a_chunked_prefill():
    from kvoffload.gates.test_k15_k16_block_sizes import window_chunks_stored_in_prefill

    assert window_chunks_stored_in_prefill(GateConnector(STOCK, None), 40) == (HORIZON_STORES, 10)


def plant_the_frontier_horizon(monkeypatch) -> None:
    """vLLM 0.27-0.29's horizon in a fixed release (0.30+): every store's frontier is taken for
    the request's final segment end (``_reachable_store_block_mask``'s
    ``final_segment_end_chunk_idx``), as before PR #54362."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as offloading

    cls = offloading.OffloadingConnectorScheduler
    plain = cls._reachable_store_block_mask

    def frontier(self, group_config, start_chunk_idx, end_chunk_idx, final_segment_end_chunk_idx, *args, **kwargs):
        return plain(self, group_config, start_chunk_idx, end_chunk_idx, end_chunk_idx, *args, **kwargs)
    monkeypatch.setattr(cls, "_reachable_store_block_mask", frontier)


def test_k15s_gate_fails_vllm_0_27_to_0_29_and_passes_the_others(monkeypatch):
    if RELEASE >= (0, 30, 0):
        with monkeypatch.context() as planted:
            plant_the_frontier_horizon(planted)
            with pytest.raises(AssertionError, match=r"^window chunks \[0, 3, 6\] stored that no hit can read"):
                run_k15(STOCK)
    if (0, 27, 0) <= RELEASE < (0, 30, 0):
        with pytest.raises(AssertionError, match=r"^window chunks \[0, 3, 6\] stored that no hit can read"):
            run_k15(STOCK)
    else:
        run_k15(STOCK)


def test_the_reference_stores_the_window_chunks_vllm_0_32_stores():
    """0.30+'s set: the segments' tails and the prompt's (the final segment's horizon)."""
    from kvoffload.gates.test_k15_k16_block_sizes import window_chunks_stored_in_prefill

    stores = {1, 2, 4, 5, 7, 8, 9} if DENSE_RETENTION else {7, 8}
    assert window_chunks_stored_in_prefill(GateConnector(REFERENCE, None), 40) == (stores, 10)
    run_k15(REFERENCE)


def test_k15s_gate_fails_the_reference_with_the_frontier_horizon_and_with_every_chunk(monkeypatch):
    """The frontier taken for the final segment's end (0.27-0.29's horizon) planted; 0.29's preset
    (``WindowRules.FRONTIER_TAILS``) stores every window chunk of this story, 0.27-0.29's result:
    both fail."""
    from kvoffload.core.hybrid_stores import HybridStorePlanner

    if DENSE_RETENTION:
        with monkeypatch.context() as planted:
            planted.setattr(HybridStorePlanner, "_horizon", lambda self, req, tpc, end: end)
            with pytest.raises(AssertionError, match=r"^window chunks \[0, 3, 6\] stored that no hit can read"):
                run_k15(REFERENCE)
    with pytest.raises(AssertionError, match=r"^window chunks \[0, 3, 6\] stored that no hit can read "
                                             r"\(stored \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\]\)\n"):
        run_k15(REFERENCE, "vllm-0.29")
    run_k15(REFERENCE, "vllm-0.30")


@pytest.mark.parametrize("preset", ["vllm-0.25", "vllm-0.26"])
def test_the_presets_of_0_25_and_0_26_store_the_segments_tails_as_those_releases(monkeypatch, preset):
    """``WindowRules.SEGMENT_TAILS``: each whole 12-token segment's last two window chunks, not
    the prompt's (chunk 9 opens a segment the prompt leaves partial), as vLLM 0.25-0.26's stock
    connectors store (``HORIZON_STORES`` there): K15 passes. With 0.29's window rule planted into
    the preset it stores every chunk and fails."""
    import dataclasses

    from kvoffload.core.fixes import PRESETS, WindowRules
    from kvoffload.gates.test_k15_k16_block_sizes import window_chunks_stored_in_prefill

    assert window_chunks_stored_in_prefill(GateConnector(REFERENCE, preset), 40) == ({1, 2, 4, 5, 7, 8}, 10)
    run_k15(REFERENCE, preset)
    old = PRESETS[preset]
    monkeypatch.setitem(PRESETS, preset, dataclasses.replace(
        old, rules=dataclasses.replace(old.rules, windows=WindowRules.FRONTIER_TAILS)))
    with pytest.raises(AssertionError, match=r"^window chunks \[0, 3, 6\] stored that no hit can read"):
        run_k15(REFERENCE, preset)


@pytest.mark.parametrize("num_tokens, step", [(40, 8), (40, 12), (40, 16), (40, 24), (37, 16), (44, 20)])
def test_the_releases_preset_stores_the_window_chunks_its_stock_connector_stores(num_tokens, step):
    """The preset of the installed release (``releases.PRESET_OF``; the reference from 0.31)
    submits the window chunks its stock connector submits, whatever the prefill's step: 0.27-0.29
    take each step's frontier for a segment's end (``WindowRules.FRONTIER_TAILS``: 16 a step
    stores 3 and 6, not 0), 0.25-0.26 only whole segments' tails, 0.30+ the reachable chunks."""
    import vllm

    from kvoffload.gates.test_k15_k16_block_sizes import window_chunks_stored_in_prefill
    from kvoffload.releases import PRESET_OF

    stock = window_chunks_stored_in_prefill(GateConnector(STOCK, None), num_tokens, step)
    ours = window_chunks_stored_in_prefill(GateConnector(REFERENCE, PRESET_OF[vllm.__version__]), num_tokens, step)
    assert ours == stock


def window_chunks_stored_until_abort(kv_connector, num_tokens: int, step: int, steps: int) -> list[int]:
    """The window chunks the connector submits for C (``num_tokens``, ``nested-blocks-tiny``)
    prefilled ``step`` tokens a step and aborted after ``steps`` steps, its finished stores
    included."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    from kvoffload.gates.test_k15_k16_block_sizes import NESTED, request, scheduler_alone

    with scheduler_alone(kv_connector, NESTED.replace(max_num_batched_tokens=step)) as (scheduler, tier):
        scheduler.add_request(request(scheduler, num_tokens, 4))
        keys, submitted = tier.group_keys("C")[1], set()
        tier.note_stores(submitted)
        for done in range(steps + 1):
            if done == steps:
                scheduler.finish_requests(["C"], RequestStatus.FINISHED_ABORTED)
            out = scheduler.schedule()
            ids = list(out.num_scheduled_tokens)
            scheduler.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[] for _ in ids],
                logprobs=None, prompt_logprobs_dict={}, pooler_output=[], kv_connector_output=KVConnectorOutput()))
        return sorted(i for i, key in enumerate(keys) if key in submitted)


ABORTS = [(40, 8, 1), (40, 8, 2), (36, 8, 4), (40, 16, 2), (48, 20, 2), (30, 12, 2)]


@pytest.mark.skipif(RELEASE < (0, 27, 0), reason="0.25-0.26 store an aborted request up to its tokens and die on "
                    "assert len(offload_keys) == len(offload_block_ids) (aborted_watermark, K07)")
@pytest.mark.parametrize("num_tokens, step, steps", ABORTS)
def test_an_aborted_prefill_stores_the_window_chunks_its_releases_connector_stores(num_tokens, step, steps):
    """0.30+ look again at the window tail of the segment an abort cut short
    (``reconsider_final_swa_tail``; ``HybridStorePlanner._final_tail``): the release's preset (the
    reference from 0.31) submits what the stock connector submits, before 0.30 too."""
    import vllm

    from kvoffload.releases import PRESET_OF

    stock = window_chunks_stored_until_abort(GateConnector(STOCK, None), num_tokens, step, steps)
    ours = window_chunks_stored_until_abort(GateConnector(REFERENCE, PRESET_OF[vllm.__version__]), num_tokens, step,
                                            steps)
    assert ours == stock


@pytest.mark.skipif(RELEASE < (0, 30, 0), reason="vLLM 0.30 is the first to look again at a final window tail")
def test_without_the_second_look_the_reference_misses_what_vllm_stores(monkeypatch):
    """The look planted out of the reference (and, as a control, out of the stock connector:
    ``_final_swa_alignment_blocks`` None) drops a window chunk in every abort story above but
    the one whose abort ends a segment."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as offloading

    from kvoffload.core.hybrid_stores import HybridStorePlanner

    stock = [window_chunks_stored_until_abort(GateConnector(STOCK, None), *abort) for abort in ABORTS]
    monkeypatch.setattr(HybridStorePlanner, "_final_tail", lambda self, req, g, cursor, end: None)
    monkeypatch.setattr(offloading.OffloadingConnectorScheduler, "_final_swa_alignment_blocks", lambda self, g: None)
    plain = [window_chunks_stored_until_abort(GateConnector(STOCK, None), *abort) for abort in ABORTS]
    ours = [window_chunks_stored_until_abort(GateConnector(REFERENCE, None), *abort) for abort in ABORTS]
    assert ours == plain
    # the chunk before each abort's end (1 step of 8: chunk 0, 16: 3, 32: 6, 40: 9); 24 ends a segment
    assert [set(full) - set(without) for without, full in zip(plain, stock)] == [{0}, {3}, {6}, {6}, {9}, set()]
