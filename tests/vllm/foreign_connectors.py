"""Planted connectors for the foreign-connector tests: vLLM's SimpleCPUOffloadConnector with one
of its guards removed, and small connectors that fail the ways a foreign connector can
(loaded by module path, as a user names a connector)."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import SimpleCPUOffloadConnector

from kvoffload.vllm.connector import KVOffloadConnector


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


class StartFailsConnector(KVOffloadConnector):
    """Fails while its worker registers the KV caches, as LMCache 0.5.6 does on a CPU ("No supported
    cpu connector found")."""

    def register_kv_caches(self, kv_caches) -> None:
        raise RuntimeError("planted: No supported cpu connector found")


class AttributeErrorConnector(KVOffloadConnector):
    """Dies of an exception type no engine used to count as a crash, once the first request
    finishes (as LMCache's worker dies of an AttributeError)."""

    def build_connector_meta(self, scheduler_output):
        if scheduler_output.finished_req_ids:
            raise AttributeError("planted: 'NoneType' object has no attribute 'slot_mapping'")
        return super().build_connector_meta(scheduler_output)


class MissingFileConnector(KVOffloadConnector):
    """A disk connector's way to die (vLLM's ExampleConnector): the file of a hit is not there."""

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens:
            raise FileNotFoundError(2, "No such file or directory", f"kv-store/{request.request_id}.safetensors")
        super().update_state_after_alloc(request, blocks, num_external_tokens)


class HangsConnector(KVOffloadConnector):
    """Never returns from the lookup of the third request it is asked about (a lock nobody
    releases): the per-step bound must stop the run and name the call and the request."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self._asked = getattr(self, "_asked", set()) | {request.request_id}
        if len(self._asked) >= 3:
            import threading

            threading.Event().wait()
        return super().get_num_new_matched_tokens(request, num_computed_tokens)


class FakeLMCacheConnector(KVOffloadConnector):
    """Named as LMCache's connectors are: on a machine without CUDA the suite refuses it in one
    line (its KV path needs CUDA ops), before it could degrade to recompute quietly."""
