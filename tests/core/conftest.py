"""A scripted driver for the scheduler side: the test plays the engine, step by step.

Each test writes the scheduler outputs itself (which request got which blocks, which finished),
so a story can pin down exactly the ordering a historical bug needed.
"""

from __future__ import annotations

from typing import Callable, Sequence

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.core.manager import CPUOffloadManager
from kvoffload.core.request import Request
from kvoffload.core.scheduler import ReferenceConnectorScheduler
from kvoffload.core.types import (
    ConnectorConfig,
    RequestStatus,
    SchedulerOutput,
    StepPlan,
    TransferResult,
)

EOS = 50256


class RecordingManager(CPUOffloadManager):
    """A CPU manager that logs every call and can decline stores on request.

    ``decline(req_id, keys)`` returning True makes ``prepare_store`` answer None (allocation
    failure), like the "decline-until-finished" trick of vLLM's tests.
    """

    def __init__(self, capacity: int, decline: Callable[[str, Sequence[bytes]], bool] | None = None, **kw):
        super().__init__(capacity, **kw)
        self.calls: list[tuple[str, str]] = []
        self.decline = decline

    def prepare_store(self, req_id, keys, positions=None):
        self.calls.append(("prepare_store", req_id))
        if self.decline is not None and self.decline(req_id, keys):
            self._check_submit(req_id, "prepare_store")
            self.calls.append(("declined", req_id))
            return None
        return super().prepare_store(req_id, keys, positions)

    def on_request_finished(self, req_id):
        self.calls.append(("on_request_finished", req_id))
        super().on_request_finished(req_id)

    def complete_store(self, keys, success=True):
        self.calls.append(("complete_store", ""))
        super().complete_store(keys, success)


class Script:
    def __init__(self, block_size=4, blocks_per_chunk=1, cpu_chunks=16, fixes: Fixes | None = None,
                 decline=None, num_workers=1, offload_prompt_only=False, raise_on_violation=True):
        self.config = ConnectorConfig(block_size=block_size, blocks_per_chunk=blocks_per_chunk,
                                      cpu_chunks=cpu_chunks, num_workers=num_workers,
                                      offload_prompt_only=offload_prompt_only)
        fixes = fixes or Fixes()
        self.manager = RecordingManager(cpu_chunks, decline=decline, strict_lifecycle=True,
                                        raise_on_violation=raise_on_violation, recency=fixes.rules.recency)
        self.connector = ReferenceConnectorScheduler(self.config, fixes, self.manager)
        self.requests: dict[str, Request] = {}
        self.step_index = 0
        self.stored_chunks: dict[str, set[int]] = {}  # request -> chunk indices of built store jobs

    def add(self, req_id: str, prompt: Sequence[int]) -> Request:
        req = Request(req_id, prompt, self.config.block_size)
        self.requests[req_id] = req
        self.connector.on_new_request(req)
        return req

    def admit(self, req: Request, blocks: Sequence[int], local_tokens: int = 0) -> int | None:
        """Admission of a waiting request: lookup, then allocation of ``blocks``."""
        hits, _ = self.connector.get_num_new_matched_tokens(req, local_tokens)
        if hits is None:
            return None
        req.num_computed_tokens = local_tokens
        self.connector.update_state_after_alloc(req, blocks, hits)
        req.status = RequestStatus.WAITING_FOR_LOAD if hits else RequestStatus.RUNNING
        return hits

    def step(self, scheduled: dict[str, int] | None = None, new_blocks: dict[str, Sequence[int]] | None = None,
             finished: Sequence[str] = (), preempted: Sequence[str] = ()) -> StepPlan:
        scheduled = scheduled or {}
        out = SchedulerOutput(step=self.step_index, num_scheduled_tokens=dict(scheduled),
                              new_block_ids={r: tuple(b) for r, b in (new_blocks or {}).items()},
                              finished_req_ids=tuple(finished), preempted_req_ids=tuple(preempted))
        plan = self.connector.build_connector_meta(out)
        for req_id, n in scheduled.items():  # _update_after_schedule
            self.requests[req_id].num_computed_tokens += n
            self.requests[req_id].status = RequestStatus.RUNNING
        for job in plan.store_jobs:
            self.stored_chunks.setdefault(job.req_id, set()).update(job.chunk_indices)
        self.step_index += 1
        self.connector.check_invariants()
        return plan

    def sample(self, req_id: str, *tokens: int) -> None:
        self.requests[req_id].append_tokens(tokens)

    def finish(self, req_id: str, status=RequestStatus.FINISHED_STOPPED, blocks: Sequence[int] = ()) -> None:
        req = self.requests[req_id]
        req.status = status
        self.connector.request_finished(req, blocks)
        self.connector.check_invariants()

    def complete(self, *job_ids: int, workers: int = 1, success: bool = True) -> None:
        self.connector.update_connector_output(
            [TransferResult(job_id, success) for job_id in job_ids for _ in range(workers)])
        self.connector.check_invariants()

    def store_prefix(self, req_id: str, tokens: Sequence[int], blocks: Sequence[int]) -> Request:
        """``req_id`` prefills ``tokens``, its stores complete, it finishes: its chunks are ready."""
        req = self.add(req_id, tokens)
        self.admit(req, blocks)
        plan = self.step(scheduled={req_id: len(tokens)}, new_blocks={req_id: blocks})
        self.complete(*[job.job_id for job in plan.store_jobs])
        self.sample(req_id, EOS)
        self.finish(req_id)
        self.step(finished=[req_id])
        return req


@pytest.fixture
def script():
    return Script


def plan_jobs(plan: StepPlan):
    return [job.job_id for job in plan.store_jobs]
