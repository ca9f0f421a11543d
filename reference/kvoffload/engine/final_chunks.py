"""Did each finished request's last fully-written chunk reach the offload tier? (the glossary's
``last_chunk_offloaded_rate``: exactly the symptom of vLLM PR #48596's scheduler half, the fix
``last_block_at_finish``: the chunk completed last was never stored).

Read from the tier's bytes, not from the connector's word: a chunk reached the tier when a
successful store left its KV there, checked by the content oracle's fingerprint of the chunk's
last position (a store that copied other KV does not count). Either the request's own stores
put it there, while it ran or after it finished (the deferred final store, PR #48596), or the tier
already held it when the request finished (another request with the same prefix stored the same
KV, so the connector rightly skips it). A later request that stores the same prefix (the next
turn of a conversation does) does not count: the chunk was lost when it was needed.

Memory follows what is live: the chunks each live request stored, the fingerprint in each tier
slot (bounded by the tier), and the chunk each finished request still waits for.
"""

from __future__ import annotations

from collections import Counter
from itertools import repeat

from kvoffload.core.types import TransferJob
from kvoffload.engine.live import LiveRequest
from kvoffload.engine.oracle import KVOracle
from kvoffload.engine.record import last_written_chunk_end


class FinalChunkWatch:
    def __init__(self, oracle: KVOracle, tokens_per_chunk: int, prompt_only: bool):
        self.oracle = oracle
        self.tokens_per_chunk = tokens_per_chunk
        # With offload_prompt_only the connector stores prompt chunks only (vLLM's default): the
        # last chunk it should store ends within the prompt.
        self.prompt_only = prompt_only
        self.counted = 0  # finished requests with at least one fully-written chunk
        self.offloaded = 0  # ... whose last such chunk reached the tier
        self._stored_by: dict[str, set[int]] = {}  # live request -> its chunks a store of its own left in the tier
        self._slot_fp: dict[int, int] = {}  # tier slot -> fingerprint of the chunk its bytes hold
        self._in_tier: Counter[int] = Counter()  # fingerprint -> tier slots holding it
        self._awaited: dict[str, int] = {}  # finished request -> the fingerprint its own store may still bring

    def stored(self, job: TransferJob) -> None:
        """A store completed successfully: what its slots now hold (group 0's chunks: the last
        chunk is full attention's; group 0's chunk in tokens is ``tokens_per_chunk``)."""
        tpc, oracle = self.tokens_per_chunk, self.oracle
        for chunk, slot, group in zip(job.chunk_indices, job.chunk_slots, job.chunk_groups or repeat(0)):
            previous = self._slot_fp.pop(slot, None)
            if previous is not None:
                self._in_tier[previous] -= 1
                if not self._in_tier[previous]:
                    del self._in_tier[previous]
            if group:  # another group's chunk (its own block size, its salt): never a request's last chunk
                continue
            held = oracle.tier_fingerprint(slot)
            self._slot_fp[slot] = held
            self._in_tier[held] += 1
            if oracle.is_live(job.req_id) and held == oracle.fingerprint(job.req_id, (chunk + 1) * tpc - 1):
                self._stored_by.setdefault(job.req_id, set()).add(chunk)
            if self._awaited.get(job.req_id) == held:
                del self._awaited[job.req_id]
                self.offloaded += 1

    def finished(self, live: LiveRequest, aborted: bool) -> None:
        """``live`` finished (its fingerprints still held): note its last fully-written chunk."""
        req = live.req
        stored = self._stored_by.pop(live.req_id, ())
        end = last_written_chunk_end(req.num_tokens, req.num_computed_tokens, aborted, self.tokens_per_chunk)
        if self.prompt_only:
            end = min(end, req.num_prompt_tokens // self.tokens_per_chunk * self.tokens_per_chunk)
        if end == 0:
            return
        self.counted += 1
        last = self.oracle.fingerprint(live.req_id, end - 1)
        if end // self.tokens_per_chunk - 1 in stored or last in self._in_tier:
            self.offloaded += 1
        else:
            self._awaited[live.req_id] = last
