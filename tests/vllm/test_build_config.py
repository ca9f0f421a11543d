"""What the vllm-scheduler replay asks of vLLM before the first step (kvoffload/vllm/build.py):
the host bytes of the stock connector's chunks, and a connector vLLM cannot import named in one
line (docs/vllm.md)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.core.types import ConfigError  # noqa: E402
from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.vllm import build  # noqa: E402
from kvoffload.vllm.build import ConnectorLoad  # noqa: E402


@pytest.mark.parametrize("blocks_per_chunk", [1, 2, 5])
def test_a_chunk_on_the_host_holds_all_its_blocks_rounded_up_to_whole_pages(blocks_per_chunk):
    # The stock connector's cpu_bytes_to_use is cpu_chunks of these: fewer bytes than the blocks
    # hold and vLLM makes fewer chunks than the workload's cpu_chunks.
    engine = EngineConfig(block_size=16, blocks_per_chunk=blocks_per_chunk)
    raw = blocks_per_chunk * build.block_bytes(16)
    host = build.chunk_bytes_on_host(engine)
    assert host % build.HOST_PAGE == 0 and raw <= host < raw + build.HOST_PAGE


def test_a_connector_module_that_does_not_import_is_a_config_error_naming_it():
    engine = EngineConfig()
    load = ConnectorLoad("no_such_module_of_kvoffload_tests:Missing")
    with pytest.raises(ConfigError, match=r"^cannot load connector 'Missing' from no_such_module_of_kvoffload_tests: "
                                          r"No module named 'no_such_module_of_kvoffload_tests'"):
        build.build_vllm_config(engine, load.transfer_config(engine, "stepped"), 256)


@pytest.mark.parametrize("model", [EngineConfig().model, "gpt-oss-tiny"])
def test_the_stock_connector_makes_the_workloads_cpu_chunks_on_a_dense_and_a_hybrid_model(model):
    """vLLM divides cpu_bytes_to_use by a chunk's bytes in one group (a hybrid model keeps one
    layer per group, the dense model both in one): the bytes given must come out as the
    workload's cpu_chunks chunks, not fewer, on either kind of model."""
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.gates.story import TINY, tokens
    from kvoffload.vllm.replay import VllmSchedulerReplay

    engine = TINY.replace(model=model, cpu_chunks=12, blocks_per_chunk=2)
    replay = VllmSchedulerReplay([RequestSpec("A", tokens(1, 8), tokens(2, 1))], engine, ConnectorLoad(build.STOCK))
    try:
        assert replay.scheduler.connector.connector_scheduler.manager._num_chunks == 12
    finally:
        replay.close()
