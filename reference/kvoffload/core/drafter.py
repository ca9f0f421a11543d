"""Which KV cache groups the reference connector treats as an EAGLE/MTP drafter's, and what that
changes (vLLM 0.32 ``offloading/scheduler.py``; docs/hybrid.md, "Gates", K17).

``SchedulerOffloadConfig.from_spec`` marks a group a drafter's where vLLM's KV cache config flags
it (``KVCacheGroupSpec.is_eagle_group``; here ``KVCacheGroup.drafter``). Under an EAGLE drafter
whose KV shares the target's groups (a shared-group MTP model), no group is flagged: vLLM 0.30+
then takes none for a drafter's (PRs #52771, #52807), 0.25-0.29 took every group
(``ReleaseRules.unflagged_groups_draft``, vLLM #52735). A drafter group:

- in a lookup (``_lookup_complete_chunks``) asks for one chunk past the bound and drops the last
  chunk it found, once per convergence round (``eagle_verified``); a window needs one chunk more
  in a row. A Mamba group, a window of one chunk, then needs the state a chunk before the hit's
  too, which no store offers: the hit is 0;
- stores (``storable_chunks``) leave out the trailing chunk while the request decodes, its draft
  KV volatile until the request finishes.
"""

from __future__ import annotations

from typing import Sequence

from kvoffload.core.fixes import ReleaseRules
from kvoffload.core.model import KVCacheGroup


def drafter_groups(groups: Sequence[KVCacheGroup], eagle_drafts: int, rules: ReleaseRules) -> frozenset[int]:
    """The groups a drafter's: those flagged; with none flagged under an EAGLE drafter, every
    group where the release took them all, none otherwise."""
    flagged = frozenset(g for g, group in enumerate(groups) if group.drafter)
    if flagged or not eagle_drafts:
        return flagged
    return frozenset(range(len(groups))) if rules.unflagged_groups_draft else frozenset()


def storable_chunks(chunks: int, drafter: bool, decoding: bool, finished: bool) -> int:
    """``storable_chunks``' exclusion: a drafter group's trailing chunk waits while decoding."""
    return max(chunks - 1, 0) if drafter and decoding and not finished else chunks
