"""Identifiers and the frozen values that cross the engine / connector / worker boundaries.

Nothing here imports torch or vllm (numpy only, for token buffers).

Direction of travel, one engine step:

    engine scheduler --SchedulerOutput--> connector scheduler side --StepPlan--> worker side
    worker side --TransferResult...--> engine --> connector scheduler side (update_connector_output)

The request itself is *not* copied at the boundary: like vLLM, the connector keeps a reference to
the live request and reads it through the read-only :class:`RequestView` protocol. Copying every
running request's token list each step would make the simulator quadratic in output length.
"""

from __future__ import annotations

import enum
import hashlib
from array import array
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Protocol, Sequence

import numpy as np

ReqId = str
JobId = int
BlockId = int  # GPU block id; 0 is the null block, never handed to a request
ChunkSlot = int  # slot index in the offload (CPU) tier
OffloadKey = bytes  # the chained hash of the last GPU block of a chunk

NULL_BLOCK: BlockId = 0

_HASH_KEY = b"kvoffload-bench/block-hash/v1"
_ROOT_HASH = b"\x00" * 16
# The keyed state before any data: copying it skips the key block that a fresh keyed BLAKE2b
# compresses first, so a block hash costs one copy, two updates and a digest.
_KEYED = hashlib.blake2b(digest_size=16, key=_HASH_KEY)
# Token ids are hashed as int32 in the machine's byte order (array("i")): vocabularies are far
# below 2**31, and a live request's token buffer is 4 bytes a token (core/request.py).
TOKEN_TYPECODE = "i"
_TOKEN_BYTES = 4


def token_bytes(token_ids: Sequence[int]) -> memoryview:
    """The int32 bytes of ``token_ids``, without copying when they already are an int32 array
    (``array("i")`` or a contiguous numpy int32 array)."""
    if isinstance(token_ids, array) and token_ids.typecode == TOKEN_TYPECODE:
        return memoryview(token_ids).cast("B")
    if isinstance(token_ids, np.ndarray):
        return memoryview(np.ascontiguousarray(token_ids, dtype=np.int32)).cast("B")
    return memoryview(array(TOKEN_TYPECODE, token_ids)).cast("B")


def chain_block_hash(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Hash of one full block of token ids, chained on the previous block's hash.

    A keyed BLAKE2b over (parent hash, int32 token ids): equal prefixes give equal hashes, and
    the value does not depend on PYTHONHASHSEED or the process.
    """
    h = _KEYED.copy()
    h.update(parent if parent is not None else _ROOT_HASH)
    h.update(token_bytes(token_ids))
    return h.digest()


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int) -> None:
    """Append hashes for every block of ``token_ids`` that became full since the last call.

    Incremental: only the blocks after ``hashes`` are read. Values equal ``chain_block_hash``
    block by block; the loop hashes slices of one int32 buffer instead of converting each block.
    """
    start = len(hashes) * block_size
    num_new = (len(token_ids) - start) // block_size
    if num_new <= 0:
        return
    data = token_bytes(token_ids[start : start + num_new * block_size])
    parent = hashes[-1] if hashes else _ROOT_HASH
    step = block_size * _TOKEN_BYTES
    copy = _KEYED.copy
    append = hashes.append
    for offset in range(0, num_new * step, step):
        h = copy()
        h.update(parent)
        h.update(data[offset : offset + step])
        parent = h.digest()
        append(parent)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_LOAD = "waiting_for_load"  # vLLM's WAITING_FOR_REMOTE_KVS
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"  # EOS sampled
    FINISHED_LENGTH = "finished_length"  # max_tokens reached
    FINISHED_ABORTED = "finished_aborted"

    is_finished: bool  # set below for every member: read on the connector's hot path


for _status in RequestStatus:
    _status.is_finished = _status.value.startswith("finished")


class RequestView(Protocol):
    """What the connector may read of a live request (never write).

    ``block_hashes[i]`` is the chained hash of GPU block i of ``all_token_ids``; it exists as soon
    as the block's *token ids* are known, even when the KV of its last slot was never written
    (the final sampled token, or a slot holding a rejected draft's KV).
    """

    @property
    def req_id(self) -> ReqId: ...
    @property
    def all_token_ids(self) -> Sequence[int]: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def status(self) -> RequestStatus: ...
    @property
    def block_hashes(self) -> Sequence[bytes]: ...
    @property
    def shared_prefix_boundary(self) -> int: ...


@dataclass(frozen=True)
class SchedulerOutput:
    """What one ``schedule()`` decided, as the connector's ``build_connector_meta`` sees it.

    ``new_block_ids[r]`` are the GPU blocks appended to request r's block table this step; for a
    request admitted from the waiting queue (new, resumed after preemption, or after its load)
    it is the whole table, prefix-hit blocks included. Ordering of every field is deterministic.
    """

    step: int
    num_scheduled_tokens: dict[ReqId, int]
    new_block_ids: dict[ReqId, tuple[BlockId, ...]]
    finished_req_ids: tuple[ReqId, ...] = ()
    preempted_req_ids: tuple[ReqId, ...] = ()
    # A Mamba group's (align mode) states to offer for storing this step, per request:
    # (group, GPU block, boundary in tokens). The engine hands them over because a state block
    # cannot be found from the block table (vLLM 0.32 ``take_boundary_state_offloads``).
    boundary_states: Mapping[ReqId, tuple[tuple[int, BlockId, int], ...]] = field(default_factory=dict)


class TransferKind(enum.Enum):
    STORE = "store"  # GPU -> offload tier
    LOAD = "load"  # offload tier -> GPU


class TransferJob(NamedTuple):
    """One copy between GPU blocks and offload-tier chunk slots.

    ``gpu_block_ids`` lists every GPU block touched, in order. ``chunk_slots[i]`` is the tier slot
    of the i-th chunk. A chunk holds ``blocks_per_chunk`` GPU blocks; the first chunk of a load
    may start mid-chunk: its first ``skip_blocks`` sub-blocks are not copied (a partial GPU
    prefix hit already covers them). ``chunk_indices`` are the request-relative chunk numbers,
    for metrics and traces.

    A hybrid model's job carries chunks of several KV cache groups (core/model.py):
    ``chunk_groups[i]`` is the group of chunk i, and ``chunk_skips[i]`` the leading sub-blocks of
    chunk i that are not copied (a sliding window's blocks already behind it, or a partial GPU hit),
    as vLLM's ``GPULoadStoreSpec`` says with ``group_sizes`` and ``block_indices``. Both empty:
    every chunk is group 0's and only the first skips, ``skip_blocks``. ``chunk_counts[i]``, when
    given, is how many sub-blocks chunk i copies from its skip on (empty: up to the chunk's end): a
    group's last chunk may stop early where vLLM's worker packs a group's blocks one after another
    (``MambaStores.BLOCK_TABLE``, core/fixes.py).

    Immutable like the dataclasses around it, but a NamedTuple: the scheduler builds one per
    store on its hot path, and a frozen dataclass costs several times more to construct.
    """

    job_id: JobId
    req_id: ReqId
    kind: TransferKind
    gpu_block_ids: tuple[BlockId, ...]
    chunk_slots: tuple[ChunkSlot, ...]
    chunk_indices: tuple[int, ...]
    skip_blocks: int = 0
    chunk_groups: tuple[int, ...] = ()
    chunk_skips: tuple[int, ...] = ()
    chunk_counts: tuple[int, ...] = ()

    def skips(self) -> tuple[int, ...]:
        """The leading sub-blocks not copied, per chunk."""
        if self.chunk_skips:
            return self.chunk_skips
        return (self.skip_blocks,) + (0,) * (len(self.chunk_slots) - 1)

    def counts(self, blocks_per_chunk: int) -> tuple[int, ...]:
        """The sub-blocks copied, per chunk."""
        if self.chunk_counts:
            return self.chunk_counts
        return tuple(blocks_per_chunk - skip for skip in self.skips())

    @property
    def is_store(self) -> bool:
        return self.kind is TransferKind.STORE


def packed_chunks(num_blocks: int, skip: int, blocks_per_chunk: int) -> tuple[list[int], list[int]]:
    """Per chunk, the leading sub-blocks skipped and the sub-blocks copied, for ``num_blocks`` GPU
    blocks laid one after another from sub-block ``skip`` of the first chunk: vLLM's worker lays a
    job's group so (``transfer_async``, ``vllm/v1/kv_offload/cpu/gpu_worker.py``)."""
    skips, counts = [], []
    while num_blocks:
        count = min(blocks_per_chunk - skip, num_blocks)
        skips.append(skip)
        counts.append(count)
        skip, num_blocks = 0, num_blocks - count
    return skips, counts


@dataclass(frozen=True)
class StepPlan:
    """Scheduler side -> worker side, once per step (vLLM's OffloadingConnectorMetadata)."""

    load_jobs: tuple[TransferJob, ...] = ()
    store_jobs: tuple[TransferJob, ...] = ()
    jobs_to_flush: frozenset[JobId] = frozenset()


@dataclass(frozen=True)
class TransferResult:
    """One worker's report that a job finished (vLLM's TransferResult + completed_jobs entry)."""

    job_id: JobId
    success: bool = True
    num_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class KVGeometry:
    """The KV layout and offload tier that the engine and the connector share: defined once here,
    extended by :class:`ConnectorConfig` and by the engine's ``EngineConfig``."""

    block_size: int = 16  # tokens per GPU block
    blocks_per_chunk: int = 1  # GPU blocks per offloaded chunk
    cpu_chunks: int = 4096  # offload-tier capacity in chunks
    offload_prompt_only: bool = False
    strict_lifecycle: bool = True
    # The model's KV cache groups (core/model.py, MODELS) and vLLM's
    # CacheConfig.prefix_cache_retention_interval (0, its default: sliding-window blocks are kept
    # only where a replay resumes; None: densely; n: also every n tokens).
    model: str = "dense"
    prefix_cache_retention_interval: int | None = 0
    # An EAGLE/MTP drafter's speculative tokens in vLLM's SpeculativeConfig (use_eagle()); 0: none
    # (n-gram drafts or none). The connector reads it as vLLM's does: which groups are a drafter's.
    eagle_drafts: int = 0

    @property
    def tokens_per_chunk(self) -> int:
        return self.block_size * self.blocks_per_chunk


@dataclass(frozen=True)
class ConnectorConfig(KVGeometry):
    """Geometry and policy of the reference connector (validated on construction)."""

    num_workers: int = 1
    raise_on_violation: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "blocks_per_chunk", "cpu_chunks", "num_workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")


class ConfigError(ValueError):
    """Invalid configuration: the message names the offending value."""


class ConnectorCrash(RuntimeError):
    """A failure the modelled vLLM release would have died of (an assert or a KeyError)."""


@dataclass(frozen=True)
class LifecycleEvent:
    """A manager call made out of order for a request (recorded in strict lifecycle mode)."""

    req_id: ReqId
    call: str
    reason: str


__all__ = [
    "BlockId",
    "ChunkSlot",
    "ConfigError",
    "ConnectorConfig",
    "KVGeometry",
    "ConnectorCrash",
    "JobId",
    "LifecycleEvent",
    "NULL_BLOCK",
    "OffloadKey",
    "ReqId",
    "RequestStatus",
    "RequestView",
    "SchedulerOutput",
    "StepPlan",
    "TransferJob",
    "packed_chunks",
    "TransferKind",
    "TransferResult",
    "cdiv",
    "chain_block_hash",
    "extend_block_hashes",
    "TOKEN_TYPECODE",
    "token_bytes",
]
