"""Planted connectors for the foreign-connector tests: vLLM's SimpleCPUOffloadConnector with one
of its guards removed, and small connectors that fail the ways a foreign connector can
(loaded by module path, as a user names a connector)."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import SimpleCPUOffloadConnector


class _UnpinnedPool:
    """vLLM's GPU ``BlockPool`` as the manager sees it, minus the pins: ``touch`` and the
    matching ``free_blocks`` do nothing."""

    def __init__(self, pool):
        self._pool = pool

    def touch(self, blocks) -> None:
        pass

    def free_blocks(self, blocks) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._pool, name)


class UnpinnedSimpleCPU(SimpleCPUOffloadConnector):
    """SimpleCPU whose manager never pins the GPU blocks its copies read or write: a block
    freed while its store is in flight is handed out again, and the store copies the new
    owner's KV under the old hash (the pin is the connector's fence)."""

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        super().bind_gpu_block_pool(_UnpinnedPool(gpu_block_pool))


class UnpinnedLazySimpleCPU(UnpinnedSimpleCPU):
    kvoffload_family = "simple-cpu-lazy"
