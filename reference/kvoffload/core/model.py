"""The model a replay serves, as vLLM sees it: an ordered list of KV cache groups.

vLLM describes a model's KV cache as ``KVCacheConfig.kv_cache_groups`` (``vllm/v1/kv_cache_interface.py``):
layers of one attention kind share a group, each group has its own block table per request and
all groups draw their blocks from one pool. This module is the suite's one description of that
(docs/design.md, "Models and connectors from outside: the shared shape"): the engine's block
pool, prefix cache and KV oracle, the reference connector's offload keys and ``vllm/build.py``
(the only translation into vLLM's ``KVCacheGroupSpec``s) all read it. One engine setting,
``model``, selects an entry of :data:`MODELS`; ``dense`` (one full-attention group) is the default
and keeps every result of the single-group engine.

The window rules of a sliding-window group are vLLM 0.32's, shared by the GPU prefix cache
(``SlidingWindowManager``, ``vllm/v1/core/single_type_kv_cache_manager.py``) and the connector's
store side (``_reachable_store_block_mask``, ``offloading/scheduler.py``), so they live here, next to
the group they describe; docs/engine.md lists each with its vLLM function.

Pure Python: the reference connector keys its chunks per group from this description.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from kvoffload.core.types import ConfigError, cdiv


class GroupKind(enum.Enum):
    FULL_ATTENTION = "full_attention"  # vLLM's FullAttentionSpec
    SLIDING_WINDOW = "sliding_window"  # SlidingWindowSpec: attends to the last `sliding_window` tokens
    MAMBA = "mamba"  # MambaSpec, align mode: one recurrent state per request


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV cache group: its kind and its window in tokens (sliding window only). ``drafter``
    marks an EAGLE/MTP drafter group. ``block_size``: the group's own block size in tokens, where
    a model sets one per layer kind (vLLM's ``KVCacheSpec.block_size`` is per group: DeepSeek-V4
    gives full attention 256 and its window 64, ``kv_cache_utils.py``'s hybrid unification); 0,
    the default: the engine's ``block_size``."""

    kind: GroupKind
    sliding_window: int = 0
    drafter: bool = False
    block_size: int = 0

    def __post_init__(self) -> None:
        if (self.kind is GroupKind.SLIDING_WINDOW) != (self.sliding_window > 0):
            raise ConfigError(f"a {self.kind.value} group has sliding_window={self.sliding_window}: "
                              "a window (in tokens) exactly for sliding-window groups")
        if self.block_size < 0 or (self.block_size and self.kind is GroupKind.MAMBA):
            # A Mamba group in align mode takes the cache's block size (vLLM's MambaSpec).
            raise ConfigError(f"a {self.kind.value} group has block_size={self.block_size}: a positive block "
                              "size of its own for attention groups only, or 0 (the engine's)")

    @property
    def label(self) -> str:
        text = self.kind.value + (f" {self.sliding_window}" if self.sliding_window else "")
        text += f" (block {self.block_size})" if self.block_size else ""
        return text + (" (drafter)" if self.drafter else "")

    def tokens_per_block(self, engine_block_size: int) -> int:
        """This group's block size in tokens, given the engine's."""
        return self.block_size or engine_block_size

    # ---- the sliding window's rules (vLLM 0.32 SlidingWindowManager) ----------------------

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens no later position attends to any more (``get_num_skipped_tokens``): their
        blocks are freed (``remove_skipped_blocks``). Mamba keeps only the state of the last
        token (``MambaManager.get_num_skipped_tokens``: ``num_computed_tokens - 1``; vLLM's
        callers treat a negative count as none). 0 for full attention."""
        if self.kind is GroupKind.MAMBA:
            return max(0, num_computed_tokens - 1)
        if self.kind is not GroupKind.SLIDING_WINDOW:
            return 0
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def blocks_for_hit(self, block_size: int) -> int:
        """Contiguous cached blocks a sliding-window prefix hit needs (``_contiguous_blocks_for_hit``)."""
        return cdiv(self.sliding_window - 1, block_size)

    def admission_cap(self, block_size: int, max_in_flight_tokens: int) -> int | None:
        """Blocks a sliding-window request holds at most, which admission reserves at most
        (``SlidingWindowSpec.max_admission_blocks_per_request``); None: no cap."""
        if self.kind is not GroupKind.SLIDING_WINDOW:
            return None
        return cdiv(self.sliding_window - 1 + max_in_flight_tokens, block_size) + 1

    def window_chunks(self, tokens_per_chunk: int) -> int | None:
        """Chunks a connector lookup needs in a row (``get_sliding_window_size_in_chunks``);
        None for full attention."""
        if self.kind is GroupKind.FULL_ATTENTION:
            return None
        if self.kind is GroupKind.MAMBA:
            return 1
        return cdiv(self.sliding_window, tokens_per_chunk)

    def load_window_chunks(self, tokens_per_chunk: int, num_tokens: int) -> int | None:
        """Chunks a load ending at ``num_tokens`` must carry (``load_window_size_in_chunks``): the
        window, or one more when the hit ends inside a chunk."""
        window = self.window_chunks(tokens_per_chunk)
        if self.kind is GroupKind.SLIDING_WINDOW:
            right_padding = -num_tokens % tokens_per_chunk
            window = max(window, cdiv(self.sliding_window - 1 + right_padding, tokens_per_chunk))
        return window

    def reachable_block_mask(self, start_block: int, end_block: int, block_size: int, alignment_tokens: int,
                             retention_interval: int | None, boundaries: Sequence[int],
                             final_segment_end_block: int | None = None) -> list[bool] | None:
        """Which blocks in ``[start_block, end_block)`` a later hit can ever read
        (``SlidingWindowManager.reachable_block_mask``); None: every block (full attention,
        dense retention, or a window longer than a segment). ``boundaries``: the token positions
        a replay resumes at (``num_prompt_tokens - 1``, a shared-prefix junction)."""
        if self.kind is GroupKind.MAMBA:
            return self._mamba_state_mask(start_block, end_block, block_size, alignment_tokens,
                                          retention_interval, boundaries)
        if self.kind is not GroupKind.SLIDING_WINDOW or alignment_tokens % block_size:
            return None
        need = self.blocks_for_hit(block_size)
        mask = [False] * (end_block - start_block)
        segment = alignment_tokens if retention_interval is None else (retention_interval or None)
        if segment is not None:
            per_segment = segment // block_size
            if need >= per_segment:
                return None
            for i in range(start_block, end_block):
                if i % per_segment >= per_segment - need:
                    mask[i - start_block] = True
            if final_segment_end_block is not None and final_segment_end_block % per_segment:
                tail_start = max(final_segment_end_block - final_segment_end_block % per_segment,
                                 final_segment_end_block - need)
                for i in range(max(start_block, tail_start), min(end_block, final_segment_end_block)):
                    mask[i - start_block] = True
        if retention_interval is not None:
            for boundary in boundaries:
                end = boundary // alignment_tokens * alignment_tokens // block_size
                for i in range(max(start_block, end - need), min(end_block, end)):
                    mask[i - start_block] = True
        return mask

    @staticmethod
    def _mamba_state_mask(start_block: int, end_block: int, block_size: int, alignment_tokens: int,
                          retention_interval: int | None, boundaries: Sequence[int]) -> list[bool] | None:
        """``MambaManager.reachable_block_mask``: a hit reads one state block, the one ending at
        its length. Dense retention (None) keeps every state; ``> 0`` one per segment (every
        block when a segment is at most one); both keep the block ending at each boundary,
        rounded down to the alignment."""
        if retention_interval is None:
            return None
        mask = [False] * (end_block - start_block)
        if retention_interval:
            per_segment = retention_interval // block_size
            if per_segment <= 1:
                return None
            first = (start_block + per_segment) // per_segment * per_segment - 1
            for i in range(first - start_block, len(mask), per_segment):
                mask[i] = True
        for boundary in boundaries:
            block = boundary // alignment_tokens * alignment_tokens // block_size - 1
            if start_block <= block < end_block:
                mask[block - start_block] = True
        return mask


FULL = KVCacheGroup(GroupKind.FULL_ATTENTION)


@dataclass(frozen=True)
class ModelDescription:
    """A model's KV cache groups, in vLLM's group order (group ``i`` is ``kv_cache_groups[i]``)."""

    name: str
    groups: tuple[KVCacheGroup, ...]
    description: str

    @property
    def is_dense(self) -> bool:
        """One full-attention group: the single-group engine, bit for bit."""
        return self.groups == (FULL,)

    @property
    def has_sliding_window(self) -> bool:
        return any(group.kind is GroupKind.SLIDING_WINDOW for group in self.groups)

    @property
    def has_mamba(self) -> bool:
        return any(group.kind is GroupKind.MAMBA for group in self.groups)

    @property
    def has_drafter_group(self) -> bool:
        """Some group is flagged a drafter's (``KVCacheGroupSpec.is_eagle_group``)."""
        return any(group.drafter for group in self.groups)

    @property
    def has_own_block_sizes(self) -> bool:
        """Some group has a block size of its own (``KVCacheGroup.block_size``)."""
        return any(group.block_size for group in self.groups)

    def unsupported(self) -> str | None:
        """Why the simulator cannot replay this model yet, or None. vLLM's scheduler
        (``--engine vllm-scheduler``) builds a Mamba group already (``vllm/build.py``)."""
        if self.has_own_block_sizes and self.has_mamba:
            # A Mamba group finer than the groups' lcm takes hits inside a block
            # (partial_hash_hits_enabled, kv_cache_utils.py), which the engine does not model.
            return "groups with a block size of their own beside a Mamba group are not modelled by the engine"
        for group in self.groups:
            if group.drafter and group.kind is not GroupKind.FULL_ATTENTION:
                return "a drafter (EAGLE/MTP) group of full attention only is modelled by the engine"
        if self.groups[0].kind is not GroupKind.FULL_ATTENTION or self.groups[0].drafter:
            return "the first group must be the target's full attention"
        return None


# The one model list: the engine setting `model`, vllm/build.py and the workloads read it.
MODELS: dict[str, ModelDescription] = {model.name: model for model in (
    ModelDescription("dense", (FULL,), "one full-attention group (a Llama-like model)"),
    # gpt-oss alternates full-attention layers with 128-token sliding-window layers: vLLM puts
    # each kind in a group of its own.
    ModelDescription("gpt-oss", (FULL, KVCacheGroup(GroupKind.SLIDING_WINDOW, sliding_window=128)),
                     "gpt-oss-like: full attention and a 128-token sliding window"),
    # The gate stories' size (block size 4): a window of two blocks.
    ModelDescription("gpt-oss-tiny", (FULL, KVCacheGroup(GroupKind.SLIDING_WINDOW, sliding_window=8)),
                     "gpt-oss at the gate stories' size: full attention and an 8-token sliding window"),
    # K16's gate (kvoffload.gates): full attention of 6-token blocks beside a 4-token window of
    # the engine's blocks (4 in the stories). The grids do not nest (their lcm is 12), so a load
    # ending on a full-attention chunk can end inside a window block; vLLM accepts any block sizes
    # its hash block (their gcd) divides (resolve_kv_cache_block_sizes, vLLM 0.25+).
    ModelDescription("mixed-blocks-tiny", (KVCacheGroup(GroupKind.FULL_ATTENTION, block_size=6),
                                           KVCacheGroup(GroupKind.SLIDING_WINDOW, sliding_window=4)),
                     "full attention of 6-token blocks and a 4-token sliding window (K16's gate)"),
    # K15's gate: full attention of 12-token blocks beside an 8-token window of the engine's
    # blocks (4): nested grids, as DeepSeek-V4's 256 and 64, so a hit ends on a 12-token segment
    # and only the window's last two blocks of each segment (and of the prompt) can serve one.
    ModelDescription("nested-blocks-tiny", (KVCacheGroup(GroupKind.FULL_ATTENTION, block_size=12),
                                            KVCacheGroup(GroupKind.SLIDING_WINDOW, sliding_window=8)),
                     "full attention of 12-token blocks and an 8-token sliding window (K15's gate)"),
    # Qwen3-Next interleaves gated-DeltaNet (Mamba-style, one state per request) with full attention.
    ModelDescription("qwen3-next", (FULL, KVCacheGroup(GroupKind.MAMBA)),
                     "Qwen3-Next-like: full attention and Mamba (align mode)"),
    # Qwen3-Next served with an MTP drafter whose attention layer registers after the target's:
    # vLLM 0.32 flags the group holding the last layer a drafter's (_annotate_eagle_groups,
    # kv_cache_utils.py), a full-attention group of its own (engine/drafter_kv.py).
    ModelDescription("qwen3-next-mtp", (FULL, KVCacheGroup(GroupKind.MAMBA),
                                        KVCacheGroup(GroupKind.FULL_ATTENTION, drafter=True)),
                     "Qwen3-Next-like with an MTP drafter's full-attention group of its own (needs "
                     "eagle_drafts)"),
)}


def model_named(name: str) -> ModelDescription:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r} (known: {', '.join(MODELS)})") from None
