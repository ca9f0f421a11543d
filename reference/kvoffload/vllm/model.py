"""The fake model runner: what a GPU worker does in one step, with the forward replaced by the
KV content oracle's writes.

Per step, in ``GPUModelRunner.execute_model``'s order (vLLM 0.32,
``vllm/v1/worker/gpu_model_runner.py`` and ``kv_connector_model_runner_mixin.py``)::

    handle_preemptions(meta)                 before the batch is updated
    bind_connector_metadata(meta)
    forward: write the fingerprint of every scheduled position (drafts too) into every layer
    start_load_kv                            after the forward (no synchronous loads)
    wait_for_save, [stepped handlers copy now], get_finished, build_connector_worker_meta
    clear_connector_metadata

The fingerprint of position p is the oracle's hash of the token prefix up to p
(``kvoffload.engine.oracle``). It goes into the first 8 bytes of head 0's slot of p in each
layer's paged view, wherever the layout puts that. A rejected draft's slot gets the fingerprint of
a prefix that never happened, exactly as a real forward would leave it.

A Mamba group (align mode) keeps no slot per position but one recurrent state per request: the
forward writes the state after the request's last scheduled token, as the hash of the tokens it
summarises and their count, into the row's block for that token count (``StateCells``,
``state_block``). A block ending on a block boundary thereby holds that boundary's state, which
is what vLLM caches and its connector stores.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from kvoffload.engine.drafter_kv import DRAFTER_LEAD
from kvoffload.engine.oracle import extend_fingerprint, group_salt, prefix_fingerprints, to_signed_int

_U64 = (1 << 64) - 1


class FingerprintCells:
    """Where position ``n`` of block ``b`` keeps its fingerprint, per layer: an index into the
    KV buffer seen as int64 (all layers share vLLM's one backing allocation)."""

    def __init__(self, kv_caches: dict[str, torch.Tensor]):
        views = list(kv_caches.values())
        storage = views[0].untyped_storage()
        self.words = torch.empty(0, dtype=torch.int64).set_(storage)
        self._base, self._block, self._slot = [], [], []
        for view in views:
            if view.untyped_storage().data_ptr() != storage.data_ptr():
                raise ValueError("KV cache views do not share one buffer")
            elem = view.element_size()
            for stride in (view.storage_offset() * elem, view.stride(0) * elem, view.stride(2) * elem):
                if stride % 8:
                    raise ValueError("a KV slot is not 8-byte aligned")
            self._base.append(view.storage_offset() * elem // 8)
            self._block.append(view.stride(0) * elem // 8)
            self._slot.append(view.stride(2) * elem // 8)

    def index(self, blocks: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        """Word indices of the given slots in every layer, layer after layer."""
        parts = [base + blocks * block + offsets * slot
                 for base, block, slot in zip(self._base, self._block, self._slot)]
        return torch.from_numpy(np.concatenate(parts))

    # How far a slot's prefix reaches past its position: 0 for the target's layers; a drafter's
    # group of its own, 1 (DrafterCells, engine/drafter_kv.py).
    lead = 0

    def values(self, sequence: "ScriptedSequence", start: int, written: np.ndarray) -> np.ndarray:
        """What the step writes at ``start`` on: the target's fingerprints, ``written``."""
        return written

    @property
    def num_layers(self) -> int:
        return len(self._base)


class DrafterCells(FingerprintCells):
    """A drafter's group of its own (``is_eagle_group``): the slot at position ``i`` holds the
    prefix through token ``i + 1`` (``set_inputs_first_pass``'s shifted inputs)."""

    lead = DRAFTER_LEAD

    def values(self, sequence: "ScriptedSequence", start: int, written: np.ndarray) -> np.ndarray:
        return sequence.written(start + self.lead, len(written))


class StateCells:
    """Where a Mamba group's state block keeps its fingerprint, per layer of the group: two words
    at the start of the block's page, the hash of the tokens the state summarises (salted with
    the group, engine/oracle.py) and how many tokens that is. A state is one value per block, not
    one per position: a Mamba layer's page is one state (vLLM 0.32 ``MambaSpec``), so positional
    cells would run past it."""

    def __init__(self, kv_caches: dict[str, torch.Tensor]):
        views = list(kv_caches.values())
        storage = views[0].untyped_storage()
        self.words = torch.empty(0, dtype=torch.int64).set_(storage)
        self._base, self._block = [], []
        for view in views:
            elem = view.element_size()
            if (view.storage_offset() * elem) % 8 or (view.stride(0) * elem) % 8:
                raise ValueError("a Mamba state page is not 8-byte aligned")
            self._base.append(view.storage_offset() * elem // 8)
            self._block.append(view.stride(0) * elem // 8)

    def index(self, blocks: np.ndarray, word: int) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([base + blocks * block + word
                                                for base, block in zip(self._base, self._block)]))

    @property
    def num_layers(self) -> int:
        return len(self._base)


def state_block(table: list[int], num_tokens: int, block_size: int) -> int:
    """The block holding the state after ``num_tokens`` tokens in align mode: the row's entry
    ``cdiv(num_tokens, block_size) - 1`` (vLLM 0.32 ``MambaManager.allocate_new_blocks`` puts the
    running state there; at a block boundary it is that boundary's state, scheduler.py's
    ``_mamba_block_aligned_split`` keeps chunks ending on them)."""
    return table[-(-num_tokens // block_size) - 1]


def write_states(cells: StateCells, writes: list[tuple[list[int], int, int]], block_size: int, group: int) -> None:
    """``writes``: (block table, tokens the state summarises, the fingerprint of that prefix)."""
    if not writes:
        return
    blocks = np.asarray([state_block(table, end, block_size) for table, end, _ in writes], dtype=np.int64)
    hashes = np.asarray([fingerprint for _, _, fingerprint in writes], dtype=np.int64) ^ np.int64(group_salt(group))
    counts = np.asarray([end for _, end, _ in writes], dtype=np.int64)
    cells.words[cells.index(blocks, 0)] = torch.from_numpy(np.tile(hashes, cells.num_layers))
    cells.words[cells.index(blocks, 1)] = torch.from_numpy(np.tile(counts, cells.num_layers))


def read_state(cells: StateCells, table: list[int], num_tokens: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The state block a request resuming at ``num_tokens`` reads: (hashes, token counts), one per layer."""
    blocks = np.asarray([state_block(table, num_tokens, block_size)], dtype=np.int64)
    return cells.words[cells.index(blocks, 0)].numpy(), cells.words[cells.index(blocks, 1)].numpy()


class ScriptedSequence:
    """One request's whole scripted token sequence and the fingerprint of every prefix."""

    __slots__ = ("truth", "fingerprints")

    def __init__(self, truth: tuple[int, ...]):
        self.truth = truth
        self.fingerprints = prefix_fingerprints(np.asarray(truth, dtype=np.int64)).view(np.int64)

    def written(self, start: int, count: int) -> np.ndarray:
        """What a forward writes at positions [start, start + count): the true prefixes, and past
        the script (async: the step scheduled after an EOS) prefixes that never happened."""
        inside = self.fingerprints[start:start + count]
        if len(inside) == count:
            return inside
        past = self.draft_fingerprints(len(self.truth) - 1, start + count - len(self.truth), 0)
        return np.concatenate([inside, np.asarray(past[len(past) - (count - len(inside)):], dtype=np.int64)])

    def draft_fingerprints(self, start: int, num_drafts: int, accepted: int) -> list[int]:
        """Fingerprints of positions start+1 .. start+num_drafts: the true prefix while drafts
        are accepted, a diverging one from the first rejected draft on."""
        previous = int(self.fingerprints[start]) & _U64
        values = []
        for j in range(num_drafts):
            position = start + 1 + j
            if j < accepted and position < len(self.truth):
                previous = int(self.fingerprints[position]) & _U64
            else:
                wrong = self.truth[position] + 1 if position < len(self.truth) else 1
                previous = extend_fingerprint(previous, wrong)
            values.append(to_signed_int(previous))
        return values


class BlockTables:
    """The worker's copy of every scheduled request's block tables, one per KV cache group, kept
    from the scheduler's outputs as ``GPUModelRunner._update_states`` keeps its input batch.
    ``tables[r]`` is group 0's, ``groups[r]`` every group's (a sliding window's null block is 0)."""

    def __init__(self, num_groups: int = 1) -> None:
        self.num_groups = num_groups
        self.tables: dict[str, list[int]] = {}
        self.groups: dict[str, list[list[int]]] = {}

    def _set(self, req_id: str, groups) -> None:
        tables = [list(ids) for ids in groups] if groups else [[] for _ in range(self.num_groups)]
        self.groups[req_id] = tables
        self.tables[req_id] = tables[0]

    def _drop(self, req_id: str) -> None:
        self.tables.pop(req_id, None)
        self.groups.pop(req_id, None)

    def update(self, scheduler_output) -> dict[str, int]:
        """Apply one output; return each scheduled request's num_computed_tokens."""
        for req_id in scheduler_output.finished_req_ids or ():
            self._drop(req_id)
        for req_id in scheduler_output.preempted_req_ids or ():
            self._drop(req_id)
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            self._set(new.req_id, new.block_ids)
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            groups = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids or req_id not in self.groups:
                self._set(req_id, groups)
            elif groups:
                for table, ids in zip(self.groups[req_id], groups):
                    table.extend(ids)
            computed[req_id] = cached.num_computed_tokens[i]
        return computed


def write_positions(cells: FingerprintCells, writes: list[tuple[list[int], int, np.ndarray]], block_size: int,
                    group: int = 0) -> None:
    """``writes``: (block table, first position, fingerprints of the positions from there on);
    ``group``: the KV cache group whose layers ``cells`` addresses (its salt, engine/oracle.py)."""
    if not writes:
        return
    blocks, offsets, values = [], [], []
    for table, start, fingerprints in writes:
        if group:
            fingerprints = fingerprints ^ np.int64(group_salt(group))
        positions = np.arange(start, start + len(fingerprints), dtype=np.int64)
        table_array = np.asarray(table, dtype=np.int64)
        blocks.append(table_array[positions // block_size])
        offsets.append(positions % block_size)
        values.append(fingerprints)
    index = cells.index(np.concatenate(blocks), np.concatenate(offsets))
    cells.words[index] = torch.from_numpy(np.tile(np.concatenate(values), cells.num_layers))


def read_positions(cells: FingerprintCells, table: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    """Fingerprints held at positions [start, end) of a request: [layers, positions]."""
    positions = np.arange(start, end, dtype=np.int64)
    blocks = np.asarray(table, dtype=np.int64)[positions // block_size]
    held = cells.words[cells.index(blocks, positions % block_size)].numpy()
    return held.reshape(cells.num_layers, end - start)


def poisoned_chunks(group_cells: list[FingerprintCells], tables, fingerprints: np.ndarray, start: int, end: int,
                    block_sizes: Sequence[int], blocks_per_chunk: int,
                    states: bool | None = None) -> list[tuple[int, int, int]]:
    """A load of positions [start, end) checked in every KV cache group against the true prefix's
    fingerprints (each group's salted, engine/oracle.py): (group, chunk, bad positions) per poisoned
    chunk. A sliding window's load starts at its first block still held (vLLM nulls the others). A
    Mamba group's load restores one state, which must summarise exactly the ``end`` tokens the
    request resumes after (its token count and their hash): one bad slot in the chunk of ``end - 1``.
    ``states``: True checks only the Mamba groups, False only the others (None: all).
    ``block_sizes``: each group's block size (its own where groups have one, vllm/group_blocks.py);
    a group's chunk is ``blocks_per_chunk`` of its blocks."""
    poisoned = []
    for group, (cells, table, block_size) in enumerate(zip(group_cells, tables, block_sizes)):
        tokens_per_chunk = block_size * blocks_per_chunk
        if states is not None and states != isinstance(cells, StateCells):
            continue
        if isinstance(cells, StateCells):  # one state: the one the request resumes from
            hashes, counts = read_state(cells, table, end, block_size)
            if (counts != end).any() or (hashes != fingerprints[end - 1] ^ np.int64(group_salt(group))).any():
                poisoned.append((group, (end - 1) // tokens_per_chunk, 1))
            continue
        first = next((p for p in range(start, end, block_size) if table[p // block_size]), end) if group else start
        if first >= end:
            continue
        held = read_positions(cells, table, first, end, block_size)
        lead = cells.lead
        bad = (held != fingerprints[first + lead:end + lead] ^ np.int64(group_salt(group))).any(axis=0)
        chunks = (np.nonzero(bad)[0] + first) // tokens_per_chunk
        poisoned.extend((group, chunk, int((chunks == chunk).sum())) for chunk in sorted(set(chunks.tolist())))
    return poisoned
