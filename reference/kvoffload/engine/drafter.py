"""An EAGLE/MTP drafter in the engine's KV cache rules (the ``eagle_drafts`` setting): what vLLM
0.32's scheduler and KV cache manager change when ``SpeculativeConfig.use_eagle()`` holds and the
drafter's KV shares the target's groups (a shared-group MTP model: no group flagged
``is_eagle_group``, so the coordinator takes every group for a drafter's,
``KVCacheCoordinator.__init__``). The engine models the rules, not the drafter: the replay
proposes no EAGLE drafts (docs/engine.md, "Hybrid models"; docs/hybrid.md, "Gates", K17).

- a full-attention prefix hit looks one block past its bound and drops its last block
  (``HybridKVCacheCoordinator.find_longest_cache_hit``, ``eagle_proof_margin``,
  ``FullAttentionManager.find_longest_cache_hit``); a Mamba group's finder never drops;
- a Mamba state is checkpointed one block early: the last cacheable position of a prefill is the
  sequence rounded down to a block, less a block (``get_mamba_prefill_checkpoint_position``, read
  by ``Scheduler._mamba_block_aligned_split``), and the states kept under sparse retention are
  those a replay resumes at under the drop (``replay_boundaries``);
- the drafter's speculative tokens count as ``num_speculative_tokens`` (a Mamba row holds a
  state block per token, ``MambaBase.get_kv_cache_spec``) and as lookahead slots in a decode
  step's reserve (``Scheduler.__init__``: ``1 + num_spec_tokens + num_lookahead_tokens``).
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.core.types import BlockId


def speculative_tokens(config) -> int:
    """``VllmConfig.num_speculative_tokens``: n-gram's ``spec_tokens`` or the EAGLE drafter's."""
    return config.spec_tokens or eagle_drafts(config)


def eagle_drafts(config) -> int:
    """The setting, 0 for a stand-in config that predates it."""
    return getattr(config, "eagle_drafts", 0)


def decode_step_slots(config) -> int:
    """The slots one decode step reserves past a sequence, 0 without a drafter: the sampled
    token, the drafts and the drafter's lookahead (``VllmConfig.num_lookahead_tokens``: the EAGLE
    drafter's tokens, none for n-gram)."""
    k = speculative_tokens(config)
    return 1 + k + eagle_drafts(config) if k else 0


def checkpoint_position(num_tokens: int, block_size: int, eagle: bool) -> int:
    """``get_mamba_prefill_checkpoint_position``: the last block boundary whose state a later
    request can resume from. Without EAGLE one token is left to recompute (``num_tokens - 1``);
    with it the dropped block leaves them, so the boundary is one block lower."""
    limit = num_tokens if eagle else num_tokens - 1
    position = limit // block_size * block_size - (block_size if eagle else 0)
    return max(position, 0)


def replay_boundaries(num_prompt_tokens: int, block_size: int, eagle: bool) -> tuple[int, ...]:
    """``replay_boundaries``: the positions a replay of the prompt resumes at, whose states
    sparse retention keeps. EAGLE: a resend's and a longer sibling's, each a block lower."""
    if not eagle:
        return (num_prompt_tokens - 1,)
    resend = (num_prompt_tokens - 1) // block_size * block_size
    extension = num_prompt_tokens // block_size * block_size
    return tuple(sorted({max(resend - block_size, 0), max(extension - block_size, 0)}))


def full_attention_hit(cached_prefix, hashes: Sequence[bytes], max_length: int, block_size: int,
                       eagle: bool) -> list[BlockId]:
    """A full-attention group's hit of at most ``max_length`` tokens; under EAGLE it looks one
    block further (at most the full blocks hashed) and drops the last block it found."""
    if not eagle:
        return list(cached_prefix(hashes, max_length // block_size))
    found = list(cached_prefix(hashes, min(max_length + block_size, len(hashes) * block_size) // block_size))
    return found[:-1]
