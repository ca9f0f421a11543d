"""A minimal live request that satisfies :class:`RequestView`.

The engine owns and mutates it (tokens appended by update_from_output, computed tokens advanced
by the scheduler); the connector only reads it. Plain attributes, not properties: the connector
reads them on its hot path.

Token ids are one compact ``array("i")`` (4 bytes a token, no int objects), which is also the
buffer the block hashes are computed from: a newly full block is hashed straight from its slice.
A prompt that already is an ``array("i")`` (trace loaders build them) is shared, not copied,
until the first sampled token is appended: a request waiting in the queue costs no second copy.
"""

from __future__ import annotations

from array import array
from typing import Sequence

from kvoffload.core.types import TOKEN_TYPECODE, ReqId, RequestStatus, extend_block_hashes, token_bytes


class Request:
    __slots__ = ("req_id", "all_token_ids", "num_prompt_tokens", "num_computed_tokens", "status",
                 "block_hashes", "shared_prefix_boundary", "_block_size", "_shares_prompt")

    def __init__(self, req_id: ReqId, prompt_token_ids: Sequence[int], block_size: int):
        self.req_id = req_id
        self._shares_prompt = isinstance(prompt_token_ids, array) and prompt_token_ids.typecode == TOKEN_TYPECODE
        if self._shares_prompt:  # read only until append_tokens copies it
            self.all_token_ids = prompt_token_ids
        else:
            self.all_token_ids = array(TOKEN_TYPECODE)
            self.all_token_ids.frombytes(token_bytes(prompt_token_ids))
        self.num_prompt_tokens = len(self.all_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.block_hashes: list[bytes] = []
        # A hybrid model's shared-prefix junction (vLLM's Request.shared_prefix_boundary), set by
        # each prefix lookup (engine/kv_groups.py); 0: none.
        self.shared_prefix_boundary = 0
        self._block_size = block_size
        extend_block_hashes(self.block_hashes, self.all_token_ids, block_size)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_tokens(self, token_ids: Sequence[int]) -> None:
        """Sampled tokens (EOS included) join the sequence; newly full blocks get their hash."""
        if self._shares_prompt:  # the caller's prompt array is never written
            self.all_token_ids = self.all_token_ids[:]
            self._shares_prompt = False
        self.all_token_ids.extend(token_ids)
        extend_block_hashes(self.block_hashes, self.all_token_ids, self._block_size)

    def __repr__(self) -> str:
        return (f"Request({self.req_id!r}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
                f"{self.status.value})")
