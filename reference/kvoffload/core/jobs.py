"""JobRegistry: the single owner of every in-flight transfer job and the indexes over them.

vLLM keeps three dicts in step by hand (``_jobs``, ``req_status.transfer_jobs``,
``_block_id_to_pending_jobs``) across about eight mutation sites; each missed site became a crash
or a hang (#42761, #48102). Here one object owns all three relations and changes them only
through a handful of methods:

    job id  -> _Job (request, kind, keys, source blocks, acks still owed)
    request -> its job ids, in creation order
    block   -> store jobs that still read it (the *fence*)

A store's source blocks enter the fence when they may be handed to another request before the
copy ran: at creation for a request that is already finished, else when its request finishes
(``fence_request``); a sliding window's blocks at creation always (a hybrid model: the engine frees
them behind the window while the request runs, vLLM's ``fenced_block_ids``). Loads never enter the fence: their destination blocks belong to a request
that waits for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from kvoffload.core.types import BlockId, JobId, NULL_BLOCK, OffloadKey, ReqId


@dataclass(slots=True)
class _Job:
    job_id: JobId
    req_id: ReqId
    is_store: bool
    keys: tuple[OffloadKey, ...]
    source_blocks: tuple[BlockId, ...]  # as the job lists them (stores only; may hold the null block)
    acks_owed: int
    # Deduplicated, null block excluded; built when the job enters the fence (most stores never
    # do: their request is still running when they complete). Before the whole job is fenced, a
    # hybrid model's sliding-window blocks may be (fully_fenced False).
    fenced_blocks: frozenset[BlockId] | None = None
    fully_fenced: bool = False


@dataclass(frozen=True)
class CompletedJob:
    job_id: JobId
    req_id: ReqId
    is_store: bool
    keys: tuple[OffloadKey, ...]


@dataclass
class JobRegistry:
    num_workers: int = 1
    _next_job_id: JobId = 0
    _stale_below: JobId = 0  # completions of jobs created before the last reset are ignored
    _jobs: dict[JobId, _Job] = field(default_factory=dict)
    _jobs_by_request: dict[ReqId, dict[JobId, None]] = field(default_factory=dict)
    _store_jobs_by_block: dict[BlockId, dict[JobId, None]] = field(default_factory=dict)

    # ---- creation -------------------------------------------------------------------------

    def add_load(self, req_id: ReqId, keys: tuple[OffloadKey, ...]) -> JobId:
        # Invariant I4: a request holds one load or any number of stores, never both.
        assert not self._jobs_by_request.get(req_id), f"load for {req_id!r} while it has jobs in flight"
        return self._add(_Job(self._take_id(), req_id, False, keys, (), self.num_workers))

    def add_store(self, req_id: ReqId, keys: tuple[OffloadKey, ...], source_blocks: tuple[BlockId, ...],
                  fence_now: bool, fence_early: tuple[BlockId, ...] = ()) -> JobId:
        siblings = self._jobs_by_request.get(req_id)
        if siblings:  # I4: a loading request holds exactly one job, its load
            assert self._jobs[next(iter(siblings))].is_store, f"store for {req_id!r} while it is loading"
        else:
            siblings = self._jobs_by_request[req_id] = {}
        job_id = self._next_job_id  # inlined _take_id/_add: one store per completed chunk, every step
        self._next_job_id = job_id + 1
        job = self._jobs[job_id] = _Job(job_id, req_id, True, keys, source_blocks, self.num_workers)
        siblings[job_id] = None
        if fence_now:
            self._fence(job)
        elif fence_early:
            self._fence_blocks(job, frozenset(fence_early) - {NULL_BLOCK})
        return job_id

    def _take_id(self) -> JobId:
        job_id = self._next_job_id
        self._next_job_id += 1
        return job_id

    def _add(self, job: _Job) -> JobId:
        self._jobs[job.job_id] = job
        self._jobs_by_request.setdefault(job.req_id, {})[job.job_id] = None
        return job.job_id

    # ---- the fence ------------------------------------------------------------------------

    def fence_request(self, req_id: ReqId) -> None:
        """The request finished: its blocks may be reused, so its in-flight stores guard them."""
        for job_id in self._jobs_by_request.get(req_id, ()):
            job = self._jobs[job_id]
            if job.is_store:
                self._fence(job)

    def _fence(self, job: _Job) -> None:
        if job.fully_fenced:
            return
        self._fence_blocks(job, frozenset(job.source_blocks) - {NULL_BLOCK})
        job.fully_fenced = True

    def _fence_blocks(self, job: _Job, blocks: frozenset[BlockId]) -> None:
        already = job.fenced_blocks or frozenset()
        for block in blocks - already:
            self._store_jobs_by_block.setdefault(block, {})[job.job_id] = None
        job.fenced_blocks = already | blocks

    def stores_reading(self, blocks: Iterable[BlockId]) -> set[JobId]:
        """Fenced store jobs that still read any of ``blocks``."""
        fence = self._store_jobs_by_block
        found: set[JobId] = set()
        for block in blocks:
            jobs = fence.get(block)
            if jobs:
                found.update(jobs)
        return found

    # ---- completion -----------------------------------------------------------------------

    def is_stale(self, job_id: JobId) -> bool:
        return job_id < self._stale_below

    def acknowledge(self, job_id: JobId) -> CompletedJob | None:
        """One worker finished ``job_id``; returns the job once every worker has.

        Unknown or stale ids return None (a late report after reset_cache).
        """
        job = self._jobs.get(job_id)
        if job is None:
            return None
        job.acks_owed -= 1
        if job.acks_owed > 0:
            return None
        self._remove(job)
        return CompletedJob(job.job_id, job.req_id, job.is_store, job.keys)

    def _remove(self, job: _Job) -> None:
        del self._jobs[job.job_id]
        siblings = self._jobs_by_request[job.req_id]
        del siblings[job.job_id]
        if not siblings:
            del self._jobs_by_request[job.req_id]
        if job.fenced_blocks is not None:
            for block in job.fenced_blocks:  # a set: a block listed twice is removed once (#42761)
                readers = self._store_jobs_by_block[block]
                del readers[job.job_id]
                if not readers:
                    del self._store_jobs_by_block[block]

    def drop_all(self) -> list[JobId]:
        """reset_cache: forget every job; later completions of them are stale."""
        dropped = list(self._jobs)
        self._jobs.clear()
        self._jobs_by_request.clear()
        self._store_jobs_by_block.clear()
        self._stale_below = self._next_job_id
        return dropped

    # ---- queries --------------------------------------------------------------------------

    def jobs_of(self, req_id: ReqId) -> tuple[JobId, ...]:
        return tuple(self._jobs_by_request.get(req_id, ()))

    def request_ids(self) -> tuple[ReqId, ...]:
        return tuple(self._jobs_by_request)

    def request_keys(self):
        """The requests with jobs, as a live keys view (set operations at C speed, no copy)."""
        return self._jobs_by_request.keys()

    def has_jobs(self, req_id: ReqId) -> bool:
        return req_id in self._jobs_by_request

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def fenced_blocks(self) -> frozenset[BlockId]:
        return frozenset(self._store_jobs_by_block)

    def check_invariants(self, full: bool = True) -> None:
        """Invariants I1, I2 and I4 (docs/design.md) over the three relations; without ``full``
        only the job counts of I1 (the engine checks that every step, the rest periodically)."""
        if not full:
            assert len(self._jobs) == sum(map(len, self._jobs_by_request.values())), \
                "I1: request index and job table disagree"
            return
        by_request = {job_id for ids in self._jobs_by_request.values() for job_id in ids}
        assert by_request == set(self._jobs), "I1: request index and job table disagree"
        for req_id, ids in self._jobs_by_request.items():
            assert ids, f"empty job list kept for {req_id!r}"
            kinds = {self._jobs[j].is_store for j in ids}
            assert all(self._jobs[j].req_id == req_id for j in ids), "I1: job filed under the wrong request"
            assert kinds == {True} or len(ids) == 1, f"I4: {req_id!r} mixes loads and stores"
        for block, ids in self._store_jobs_by_block.items():
            assert ids, f"empty fence entry for block {block}"
            for job_id in ids:
                job = self._jobs.get(job_id)
                assert job is not None and job.is_store and job.fenced_blocks is not None, \
                    "I2: fence names a non-store or gone job"
                assert block in job.fenced_blocks, "I2: fence entry for a block the job does not read"
        for job in self._jobs.values():
            if job.fenced_blocks is not None:
                assert all(job.job_id in self._store_jobs_by_block.get(b, ()) for b in job.fenced_blocks)
