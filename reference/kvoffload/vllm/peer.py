"""A remote-prefill peer for composed connectors (``MultiConnector``): what a disaggregated
prefill connector (NIXL on a decode node) does to the GPU blocks, small enough to read.

It serves every request whose id starts with ``remote-``: the lookup offers the prompt (all but
its last token, whole blocks) asynchronously; the blocks vLLM allocates for it are written by the
worker's ``start_load_kv`` of the step that scheduled the load, with the KV a prefill node would
have computed (the content oracle's fingerprints of the prompt, ``model.py``), and the load is
reported finished in the same step. Those blocks are invisible to the other connector: vLLM's
``MultiConnector`` tells it about the allocation with zero external tokens, and the request is
in no scheduler output until its load has landed (catalogue K13, vLLM #46951).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

from kvoffload.engine.oracle import prefix_fingerprints

PREFIX = "remote-"


@dataclass
class PeerMetadata(KVConnectorMetadata):
    # (request, block table, first position, end position, prompt tokens) of each load to write now
    loads: list[tuple[str, list[int], int, int, tuple[int, ...]]] = field(default_factory=list)


class AsyncPeerConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        self._offered: dict[str, int] = {}  # request -> tokens already local at its lookup
        self._to_load: list[tuple[str, list[int], int, int, tuple[int, ...]]] = []
        self._served: set[str] = set()
        self._cells = None
        self._landed: set[str] = set()

    # ---- scheduler side ----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if not request.request_id.startswith(PREFIX) or request.request_id in self._served:
            return 0, False
        end = (request.num_prompt_tokens - 1) // self._block_size * self._block_size
        if end <= num_computed_tokens:
            return 0, False
        self._offered[request.request_id] = num_computed_tokens
        return end - num_computed_tokens, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        start = self._offered.pop(request.request_id, None)
        if start is None or not num_external_tokens:
            return
        self._served.add(request.request_id)
        self._to_load.append((request.request_id, list(blocks.get_block_ids()[0]), start, start + num_external_tokens,
                              tuple(request.prompt_token_ids)))

    def build_connector_meta(self, scheduler_output) -> PeerMetadata:
        meta, self._to_load = PeerMetadata(self._to_load), []
        return meta

    def request_finished(self, request, block_ids):
        self._served.discard(request.request_id)
        return False, None

    # ---- worker side -------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches) -> None:
        from kvoffload.vllm.model import FingerprintCells

        self._cells = FingerprintCells(kv_caches)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        from kvoffload.vllm.model import write_positions

        meta = self._get_connector_metadata()
        writes = []
        for req_id, table, start, end, prompt in meta.loads:
            truth = prefix_fingerprints(np.asarray(prompt, dtype=np.int64)).view(np.int64)
            writes.append((table, start, truth[start:end]))
            self._landed.add(req_id)
        write_positions(self._cells, writes, self._block_size)

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids):
        landed, self._landed = self._landed, set()
        return None, landed or None


__all__ = ["AsyncPeerConnector", "PREFIX"]
