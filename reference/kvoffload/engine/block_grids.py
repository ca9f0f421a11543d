"""Each KV cache group's block grid, for models whose groups have block sizes of their own
(``KVCacheGroup.block_size``): vLLM 0.32's rules, each with its function (docs/engine.md,
"Groups with block sizes of their own").

- ``EngineCore`` hands the scheduler the groups' lcm as its block size and hashes a request at
  their gcd (``resolve_kv_cache_block_sizes``, ``kv_cache_utils.py``); ``core/keys.py`` owns the
  gcd (``hash_tokens``), the reference connector's keys read it too.
- A group's block ``i`` is named by the request hash ending where the block ends: hashes are
  chained, so that one names the whole prefix (``BlockHashListWithBlockSize``).
- Without a Mamba group in align mode there are no hits inside a block
  (``partial_hash_hits_enabled``), so the coordinator aligns every hit to the lcm
  (``HybridKVCacheCoordinator._cache_hit_alignment_tokens``): full attention rounds its hit down to
  it (``FullAttentionManager.find_longest_cache_hit``), a sliding window's run of blocks must end
  on it (``SlidingWindowManager.find_longest_cache_hit``), and the blocks cached are those below
  the computed tokens rounded down to it (``HybridKVCacheCoordinator._align_cacheable``).
- All groups draw from one pool: every group's page is padded to the largest
  (``AttentionSpec.page_size_padded``, ``vllm/group_blocks.py``), so a block is a block whichever
  group holds it, and a group fills only its first ``block_size`` slots of it.

One block size for every group (each model but K15's and K16's) makes every rule here a no-op:
the lcm and the gcd are that block size.
"""

from __future__ import annotations

from math import lcm
from typing import Sequence

from kvoffload.core.keys import hash_tokens


class BlockGrids:
    __slots__ = ("sizes", "scheduler", "hashed", "page", "uniform", "_scales")

    def __init__(self, groups, engine_block_size: int):
        self.sizes: tuple[int, ...] = tuple(group.tokens_per_block(engine_block_size) for group in groups)
        self.hashed = hash_tokens(groups, engine_block_size)  # Request.block_hashes' block
        self.scheduler = lcm(*self.sizes)  # the hit alignment
        self.page = max(self.sizes)  # slots a pool block holds (the padded page)
        self.uniform = len(set(self.sizes)) == 1
        self._scales = tuple(size // self.hashed for size in self.sizes)

    def block_hash(self, hashes: Sequence[bytes], g: int, i: int) -> bytes:
        """Group ``g``'s block ``i``: the request hash ending where it ends."""
        return hashes[(i + 1) * self._scales[g] - 1]

    def blocks_hashed(self, num_hashes: int, g: int) -> int:
        """Group ``g``'s blocks whose hash exists, of ``num_hashes`` request hashes."""
        return num_hashes // self._scales[g]

    def aligned(self, num_tokens: int) -> int:
        """``num_tokens`` rounded down to the hit alignment (a hit's length, the tokens cached)."""
        return num_tokens - num_tokens % self.scheduler

    def run_may_end(self, g: int, end_block: int) -> bool:
        """A window's run of hit blocks may end after block ``end_block - 1``: on the alignment."""
        return end_block * self.sizes[g] % self.scheduler == 0
