"""The blocks each request's forward wrote: only the KV oracle's fence check reads them
(engine/oracle.py, ``KVOracle.check_fence``), and only in steps with stores not copied yet."""

from __future__ import annotations

from typing import Sequence


class ForwardWrites:
    """The blocks each request's forward wrote, per request id (first scheduled first); only the
    fence check reads them, and only in steps with stores not copied yet."""

    __slots__ = ("_scheduled", "_sizes")

    def __init__(self, scheduled: Sequence, group_sizes: Sequence[int]):
        """``group_sizes``: each group's block size (one entry: every group's)."""
        self._scheduled = scheduled
        self._sizes = group_sizes

    def items(self):
        sizes = self._sizes
        writes: dict[str, set[int]] = {}
        for item in self._scheduled:
            if not item.num_tokens:
                writes.setdefault(item.live.req_id, set())
                continue
            # every position start .. start + num_tokens - 1 (drafts included) is written
            end = item.start + item.num_tokens - 1
            for g, table in enumerate(item.live.tables or (item.live.blocks,)):  # a hybrid model: every group
                bs = sizes[g] if g < len(sizes) else sizes[0]
                writes.setdefault(item.live.req_id, set()).update(table[item.start // bs:end // bs + 1])
        return writes.items()
