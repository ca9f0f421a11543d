"""The KV content oracle: what every GPU slot *should* hold, and the checks against it.

A slot's first 8 bytes hold a fingerprint of the token prefix up to and including its position:
``fp[i] = fp[i-1] * B + (token[i] + 1)  (mod 2**64)``, a polynomial hash. Equal prefixes give equal
fingerprints (so KV legitimately shared between requests matches), and prefixes that differ in
any one token differ at every later position. It is computed for a whole sequence at once as
``B**i * cumsum((token[j] + 1) * B**-j)``, all in wrapping uint64 arithmetic.

:class:`KVOracle` owns the fingerprints of every request's scripted sequence, writes them into
the GPU slots a forward pass computes, and checks two things (docs/engine.md, "The KV oracle"):
every slot a load filled holds its request's fingerprint (else a :class:`PoisonedLoad`), and no
block a pending store still reads is rewritten for another request (else a
:class:`FenceViolation`). A Mamba group's block holds a state, not positions: the fingerprint of
the prefix it summarises and that prefix's token count, checked against the point a loaded
request resumes from.
"""

from __future__ import annotations

from array import array
from typing import Callable, Collection, Sequence

import numpy as np
import torch

from kvoffload.core.types import NULL_BLOCK, TOKEN_TYPECODE, StepPlan, TransferJob
from kvoffload.engine.drafter_kv import DRAFTER_LEAD, drafter_slots
from kvoffload.engine.forward_writes import ForwardWrites
from kvoffload.engine.mamba import accepted_state_end
from kvoffload.engine.record import FenceViolation, PoisonedLoad
from kvoffload.engine.requests import RequestSpec
from kvoffload.worker.kv import KVCache

_BASE = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
_BASE_INV = pow(_BASE, -1, 1 << 64)
_MASK = (1 << 64) - 1
# Steps writing at most this many positions per request compute slot indices in plain Python.
SMALL_WRITE = 16


def group_salt(group: int) -> int:
    """What a KV cache group's slots hold on top of the prefix fingerprint (XOR, as int64): the
    same prefix holds different KV in a full-attention layer and in a sliding-window layer, so a
    chunk of one group loaded into the other's blocks is a poisoned load. Group 0 holds the bare
    fingerprint (the dense model's slots are unchanged)."""
    return to_signed_int((group * _BASE * 0xD6E8FEB86659FD93) & _MASK) if group else 0


def prefix_fingerprints(token_ids: np.ndarray) -> np.ndarray:
    """uint64 fingerprint of every prefix of ``token_ids``."""
    n = len(token_ids)
    base_pows = np.cumprod(np.full(n, _BASE, dtype=np.uint64)) * np.uint64(_BASE_INV)  # B**i
    inv_pows = np.cumprod(np.full(n, _BASE_INV, dtype=np.uint64)) * np.uint64(_BASE)  # B**-i
    terms = (token_ids.astype(np.uint64) + np.uint64(1)) * inv_pows
    return base_pows * np.cumsum(terms, dtype=np.uint64)


def scripted_sequence(live) -> np.ndarray:
    """A new request's whole scripted sequence (prompt + outputs) as int64. The prompt is read
    from the request's own token buffer (an int32 ``array("i")``, copied at C speed; numpy converts a
    tuple of Python ints about 300 times slower), the outputs from the spec."""
    tokens = live.req.all_token_ids
    if isinstance(tokens, array) and tokens.typecode == TOKEN_TYPECODE and len(tokens) == live.spec.num_prompt_tokens:
        return np.concatenate([np.frombuffer(tokens, dtype=np.int32).astype(np.int64),
                               np.asarray(live.spec.output_token_ids, dtype=np.int64)])
    return np.asarray(live.truth, dtype=np.int64)


def extend_fingerprint(previous: int, token_id: int) -> int:
    """Fingerprint of a prefix extended by one token (drafts: one at a time)."""
    return (previous * _BASE + token_id + 1) & _MASK


def as_signed(values: np.ndarray) -> np.ndarray:
    """uint64 fingerprints as the int64 bit pattern stored in the slot."""
    return values.view(np.int64)


def to_signed_int(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


class KVOracle:
    def __init__(self, kv: KVCache, requests: Sequence[RequestSpec], block_size: int, tokens_per_chunk: int,
                 state_groups: Collection[int] = (), group_sizes: Sequence[int] = (),
                 drafter_groups: Collection[int] = ()):
        # ``block_size``: the slots of a GPU block (the padded page); ``group_sizes``: each group's
        # own block size where groups have their own (engine/block_grids.py): group g's token t
        # sits in slot ``t % group_sizes[g]`` of its block ``t // group_sizes[g]``, a chunk is one
        # block of the group (blocks_per_chunk 1). Empty: every group's block is the page.
        self.block_size = block_size
        self.tokens_per_chunk = tokens_per_chunk
        self._sizes = tuple(group_sizes)
        # Group 0's chunk in tokens: what the tier's final chunk watch reads (tier_fingerprint).
        self._tier_row = kv.cpu.shape[1]  # a tier chunk's slots: blocks per chunk times the page
        self._chunk0 = self._sizes[0] * (self._tier_row // block_size) if self._sizes else tokens_per_chunk
        # int64 view of each slot's fingerprint, one row per slot: [gpu_blocks * block_size]
        words = kv.gpu.view(kv.num_gpu_blocks * block_size, kv.slot_bytes).view(torch.int64)
        self._slot_fp = words[:, 0]
        # On the CPU the same slots as a numpy view: a fancy-index write costs a few µs, torch's
        # index_put a few tens (it runs every step).
        self._slot_fp_np = self._slot_fp.numpy() if kv.gpu.device.type == "cpu" else None
        # The Mamba groups (align mode): their blocks hold a state's fingerprint and, in each
        # slot's second word where it has one (slot_bytes >= 16, the default), its token count.
        self._state_groups = tuple(state_groups)
        self._drafter_groups = frozenset(drafter_groups)  # one token ahead (engine/drafter_kv.py)
        self._slot_count = words[:, 1] if kv.slot_bytes >= 16 else None
        self._slot_count_np = self._slot_count.numpy() if self._slot_count is not None and self._slot_fp_np is not None \
            else None
        # Fingerprints of each live request's scripted sequence (int64 bit patterns), made when
        # first read (its first forward or load check, not while it waits in the queue) and
        # dropped when it finishes: memory follows what runs, not the workload or its backlog.
        self._fp = _Fingerprints()
        # The offload tier as an int64 view of each slot's fingerprint: what a store left there.
        tier = kv.cpu.view(kv.num_cpu_chunks * self._tier_row, kv.slot_bytes).view(torch.int64)[:, 0]
        self._tier_fp_np = tier.numpy()

    def register(self, live) -> None:
        """A request arrived: its fingerprints are made from its scripted sequence when first read."""
        self._fp.arrived[live.req_id] = live

    def release(self, live) -> None:
        """A request finished: nothing reads its fingerprints again (loads check only live ones)."""
        self._fp.pop(live.req_id, None)
        self._fp.arrived.pop(live.req_id, None)

    def is_live(self, req_id: str) -> bool:
        """The request arrived and has not finished (its fingerprints can be read)."""
        return req_id in self._fp or req_id in self._fp.arrived

    def fingerprint(self, req_id: str, position: int) -> int:
        """The KV a live request's ``position`` must hold."""
        return int(self._fp[req_id][position])

    def tier_fingerprint(self, chunk_slot: int) -> int:
        """The fingerprint in the last position of the offload tier's ``chunk_slot`` (the chunk's
        whole token prefix: equal for equal prefixes only)."""
        return int(self._tier_fp_np[chunk_slot * self._tier_row + self._chunk0 - 1])

    def group_size(self, group: int) -> int:
        """Group ``group``'s block size in tokens (its grid; a block's slots are the page)."""
        return self._sizes[group] if self._sizes else self.block_size

    def num_fingerprinted(self) -> int:
        """Requests whose fingerprints are held (live ones that ran or loaded)."""
        return len(self._fp)

    def num_registered(self) -> int:
        """Live requests the oracle knows (fingerprinted or not yet read)."""
        return len(self._fp) + len(self._fp.arrived)

    # ---- the forward ----------------------------------------------------------------------

    def forward(self, scheduled: Sequence) -> "ForwardWrites":
        """Write each scheduled position's fingerprint into its slot (one array write per step);
        returns the blocks each request wrote (built only if the fence check needs them)."""
        page, bs = self.block_size, self.group_size(0)
        fingerprints = self._fp
        small_slots: list[int] = []  # decode-sized writes, computed in Python
        small_values: list = []  # their fingerprints: a numpy scalar or slice per request
        big_slots: list[np.ndarray] = []
        big_values: list[np.ndarray] = []
        draft_slots: list[int] = []
        draft_values: list[int] = []
        for item in scheduled:
            start, num_tokens = item.start, item.num_tokens
            if num_tokens == 1:  # the decode step: one position, one slot
                small_slots.append(item.live.blocks[start // bs] * page + start % bs)
                small_values.append(fingerprints[item.live.req_id][start:start + 1])
            elif num_tokens > 1 and not item.prefill:  # 1 real token + drafts
                blocks = item.live.blocks
                for position, value in self._draft_fingerprints(item):
                    draft_slots.append(blocks[position // bs] * page + position % bs)
                    draft_values.append(value)
            elif num_tokens <= SMALL_WRITE:
                blocks = item.live.blocks
                small_slots.extend(blocks[position // bs] * page + position % bs
                                   for position in range(start, start + num_tokens))
                small_values.append(fingerprints[item.live.req_id][start:start + num_tokens])
            else:
                end = start + num_tokens
                first, last = start // bs, (end - 1) // bs
                table = np.asarray(item.live.blocks[first:last + 1], dtype=np.int64)
                positions = np.arange(start, end, dtype=np.int64)
                big_slots.append(table[positions // bs - first] * page + positions % bs)
                big_values.append(fingerprints[item.live.req_id][start:end])
        if small_slots or big_slots or draft_slots:
            slots = np.concatenate([np.asarray(small_slots + draft_slots, dtype=np.int64), *big_slots])
            values = np.concatenate([*small_values, *big_values]) if small_values or big_values \
                else np.zeros(0, dtype=np.int64)
            if draft_slots:
                values = np.concatenate([values[:len(small_slots)], np.asarray(draft_values, dtype=np.int64),
                                         values[len(small_slots):]])
            self._write_slots(slots, values)
        return ForwardWrites(scheduled, self._sizes or (bs,))

    def forward_group(self, scheduled: Sequence, group: int, state: bool = False) -> None:
        """A hybrid model: the same positions in group ``group``'s blocks (``live.tables[group]``),
        with the group's salt; :meth:`forward` wrote group 0. ``state``: a Mamba group, whose
        blocks hold states (:meth:`_write_states`)."""
        if state or group in self._drafter_groups:
            self._write_states(scheduled, group) if state else self._write_slots(
                *drafter_slots(scheduled, group, self.block_size, self._fp, group_salt(group)))
            return
        page, bs, salt = self.block_size, self.group_size(group), np.int64(group_salt(group))
        slots, values = [], []
        one_slots, one_values = [], []  # decode steps: one position each, gathered in Python
        fingerprints = self._fp
        for item in scheduled:
            if not item.num_tokens:
                continue
            table = item.live.tables[group]
            if item.num_tokens == 1:
                start = item.start
                one_slots.append(table[start // bs] * page + start % bs)
                one_values.append(fingerprints[item.live.req_id][start])
                continue
            if item.num_tokens > 1 and not item.prefill:  # 1 real token + drafts
                written = self._draft_fingerprints(item)
                positions = np.asarray([position for position, _ in written], dtype=np.int64)
                held = np.asarray([value for _, value in written], dtype=np.int64)
            else:
                positions = np.arange(item.start, item.start + item.num_tokens, dtype=np.int64)
                held = self._fp[item.live.req_id][item.start:item.start + item.num_tokens]
            slots.append(np.asarray(table, dtype=np.int64)[positions // bs] * page + positions % bs)
            values.append(held ^ salt)
        if one_slots:
            slots.append(np.asarray(one_slots, dtype=np.int64))
            values.append(np.asarray(one_values, dtype=np.int64) ^ salt)
        if slots:
            self._write_slots(np.concatenate(slots), np.concatenate(values))

    def _write_states(self, scheduled: Sequence, group: int) -> None:
        """A Mamba group (align mode) keeps one recurrent state per request, not one value per
        position: each scheduled request's state after its last scheduled token, ``count`` tokens,
        goes into its row's block ``cdiv(count, block_size) - 1``, where align mode keeps the
        running state (engine/mamba.py). Every slot of the block holds the salted fingerprint of
        the ``count`` tokens the state summarises and, in its second word, ``count``, so a block
        ending on a boundary holds that boundary's state (what the engine caches and the connector
        stores) and a chunk of it in the tier reads as that prefix. Drafts write no state of their
        own but the boundary accepted ones reach (``mamba.accepted_state_end``)."""
        bs, fingerprints = self.block_size, self._fp
        blocks, hashes, counts = [], [], []
        for item in scheduled:
            if item.num_tokens:
                count = item.start + item.num_tokens - item.drafts
                if item.drafts:  # accepted drafts that reach a boundary leave its state there
                    count = accepted_state_end(count, item.accepted, bs, len(item.live.truth))
                blocks.append(item.live.tables[group][(count - 1) // bs])
                hashes.append(fingerprints[item.live.req_id][count - 1])
                counts.append(count)
        if not blocks:
            return
        slots = (np.asarray(blocks, dtype=np.int64)[:, None] * bs + np.arange(bs)).reshape(-1)
        self._write_slots(slots, np.repeat(np.asarray(hashes, dtype=np.int64) ^ np.int64(group_salt(group)), bs))
        if self._slot_count_np is not None:
            self._slot_count_np[slots] = np.repeat(counts, bs)
        elif self._slot_count is not None:
            self._slot_count[torch.from_numpy(slots)] = torch.from_numpy(np.repeat(counts, bs).astype(np.int64)).to(
                self._slot_count.device)

    def _draft_fingerprints(self, item) -> list[tuple[int, int]]:
        """Decode step with drafts: position ``start`` is the real last token; draft j sits at
        ``start + 1 + j``. Accepted drafts carry the true prefix; from the first rejected one on,
        the slot holds KV of a prefix that never happened."""
        live = item.live
        fingerprints, truth = self._fp[live.req_id], live.truth
        previous = int(fingerprints[item.start]) & _MASK
        written = [(item.start, to_signed_int(previous))]
        for j in range(item.num_tokens - 1):
            position = item.start + 1 + j
            if j < item.accepted and position < len(truth):
                previous = int(fingerprints[position]) & _MASK
            else:
                wrong = truth[position] + 1 if position < len(truth) else 1
                previous = extend_fingerprint(previous, wrong)
            written.append((position, to_signed_int(previous)))
        return written

    def _write_slots(self, slots: np.ndarray, values: np.ndarray) -> None:
        if self._slot_fp_np is not None:
            self._slot_fp_np[slots] = values
        else:
            self._slot_fp[torch.from_numpy(slots)] = torch.from_numpy(values).to(self._slot_fp.device)

    # ---- the checks ---------------------------------------------------------------------------

    def check_fence(self, step: int, plan: StepPlan, writes: "ForwardWrites",
                    not_copied: list[TransferJob],
                    held_by: Callable[[str], Collection[int]]) -> list[FenceViolation]:
        """No block a not-yet-copied store reads may be rewritten after its request let it go.

        ``not_copied``: the stores whose copy has not run at forward time; ``held_by(req_id)``:
        the blocks that request still holds (empty once it finished).
        """
        if not not_copied:
            return []
        readers: dict[int, set[str]] = {}
        for job in not_copied:
            held = held_by(job.req_id)
            for block in job.gpu_block_ids:
                # A block its request still holds is shared at most through the prefix cache:
                # whoever writes it writes the same prefix. The hazard is a block handed on.
                if block not in held:
                    readers.setdefault(block, set()).add(job.req_id)
        if not readers:  # every pending store reads blocks its request still holds: nothing to hit
            return []
        violations = []
        load_writes = [(job.req_id, job.gpu_block_ids, "load") for job in plan.load_jobs]
        for writer, blocks, kind in [(r, b, "forward") for r, b in writes.items()] + load_writes:
            for block in blocks:
                if readers.get(block, {writer}) - {writer}:
                    violations.append(FenceViolation(step, block, kind))
        return violations

    def check_loaded_slots(self, live, job: TransferJob, step: int) -> list[PoisonedLoad]:
        """Every slot a load filled must hold its request's fingerprint; one entry per bad chunk."""
        bs, tpc = self.block_size, self.tokens_per_chunk
        if job.chunk_groups:
            return self._check_group_chunks(live, job, step)
        start = job.chunk_indices[0] * tpc + job.skip_blocks * bs
        end = (job.chunk_indices[-1] + 1) * tpc
        blocks = np.asarray(job.gpu_block_ids, dtype=np.int64)
        slots = (blocks[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        held = self._slot_fp_np[slots] if self._slot_fp_np is not None \
            else self._slot_fp[torch.from_numpy(slots)].cpu().numpy()
        expected = self._fp[live.req_id][start:end]
        bad = held != expected
        if not bad.any():
            return []
        positions = np.nonzero(bad)[0] + start
        return [PoisonedLoad(step, live.req_id, chunk, int(((positions // tpc) == chunk).sum()))
                for chunk in sorted(set((positions // tpc).tolist()))]

    def _check_group_chunks(self, live, job: TransferJob, step: int) -> list[PoisonedLoad]:
        """A hybrid model's load: chunk by chunk, each in its group's blocks with its salt; a
        Mamba group's state at the request's resume point (:meth:`_check_states`)."""
        page, per_chunk = self.block_size, self._tier_row // self.block_size  # blocks per chunk, every group
        fingerprints, blocks = self._fp[live.req_id], iter(job.gpu_block_ids)
        poisoned = []
        counts = job.counts(per_chunk)
        for chunk, group, skip, count in zip(job.chunk_indices, job.chunk_groups, job.skips(), counts):
            bs = self.group_size(group)
            start = (chunk * per_chunk + skip) * bs
            chunk_blocks = np.asarray([next(blocks) for _ in range(count)], dtype=np.int64)
            if group in self._state_groups:  # a state, not positions: checked below
                continue
            slots = (chunk_blocks[:, None] * page + np.arange(bs)[None, :]).reshape(-1)
            held = self._slot_fp_np[slots] if self._slot_fp_np is not None \
                else self._slot_fp[torch.from_numpy(slots)].cpu().numpy()
            start += DRAFTER_LEAD if group in self._drafter_groups else 0
            bad = int((held != (fingerprints[start:start + len(slots)] ^ np.int64(group_salt(group)))).sum())
            if bad:
                poisoned.append(PoisonedLoad(step, live.req_id, chunk, bad, group))
        return poisoned + self._check_states(live, step) if self._state_groups else poisoned

    def _check_states(self, live, step: int) -> list[PoisonedLoad]:
        """Every load on a model with a Mamba group, whichever chunks it carried: the request
        resumes after ``n`` tokens (its hit; one short of a whole-request hit, which recomputes
        the last token: ``SchedulerModel.load_landed``) from the state in its row's block
        ``cdiv(n, block_size) - 1``, which must summarise exactly its first ``n`` tokens (their
        fingerprint and count). A state one token late applies a token twice (vLLM #44599,
        catalogue K18). One poisoned slot per bad state, in the chunk of the ``n``-th token, as
        vLLM's scheduler's oracle reports it (vllm/model.py, ``poisoned_chunks``)."""
        n = min(live.loaded_tokens, live.req.num_tokens - 1)
        bs, fingerprints, poisoned = self.block_size, self._fp[live.req_id], []
        for group in self._state_groups:
            table, index = live.tables[group], (n - 1) // bs
            block = table[index] if index < len(table) else NULL_BLOCK
            held = int(self._slot_fp[block * bs]) if block != NULL_BLOCK else None  # no state there at all
            count = int(self._slot_count[block * bs]) if self._slot_count is not None and held is not None else n
            if held != int(fingerprints[n - 1] ^ np.int64(group_salt(group))) or count != n:
                poisoned.append(PoisonedLoad(step, live.req_id, (n - 1) // self.tokens_per_chunk, 1, group))
        return poisoned


class _Fingerprints(dict):
    """req_id -> fingerprints, made on the first lookup from the request registered on arrival."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: dict = {}  # req_id -> LiveRequest, not fingerprinted yet

    def __missing__(self, req_id: str) -> np.ndarray:
        live = self.arrived.pop(req_id)
        fingerprints = self[req_id] = prefix_fingerprints(scripted_sequence(live)).view(np.int64)
        return fingerprints
