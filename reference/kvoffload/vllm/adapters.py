"""Translations between vLLM's scheduler objects and the reference connector's own types.

The reference connector (``kvoffload.core``) reads requests through the read-only
``RequestView`` protocol and plans from a small ``SchedulerOutput``; here both are built from
vLLM 0.32's ``Request`` and ``SchedulerOutput`` (``vllm/v1/request.py``,
``vllm/v1/core/sched/output.py``). The plan travels to the worker as :class:`StepPlanMetadata`
and completions come back as :class:`CompletedJobsMetadata`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.utils import yield_req_data
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata
from vllm.v1.request import RequestStatus as VllmStatus

from kvoffload.core.types import RequestStatus, SchedulerOutput, StepPlan, TransferResult

# Every vLLM status has a counterpart; finished statuses other than stopped and length-capped
# (ignored, error, repetition) end a request without a complete forward, like an abort: the
# connector then stores only what was computed.
_STATUS = {
    VllmStatus.WAITING: RequestStatus.WAITING,
    VllmStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR: RequestStatus.WAITING,
    VllmStatus.WAITING_FOR_REMOTE_KVS: RequestStatus.WAITING_FOR_LOAD,
    VllmStatus.WAITING_FOR_STREAMING_REQ: RequestStatus.WAITING,
    VllmStatus.RUNNING: RequestStatus.RUNNING,
    VllmStatus.PREEMPTED: RequestStatus.PREEMPTED,
    VllmStatus.FINISHED_STOPPED: RequestStatus.FINISHED_STOPPED,
    VllmStatus.FINISHED_LENGTH_CAPPED: RequestStatus.FINISHED_LENGTH,
}


def project_status(status: VllmStatus) -> RequestStatus:
    found = _STATUS.get(status)
    if found is not None:
        return found
    return RequestStatus.FINISHED_ABORTED if VllmStatus.is_finished(status) else RequestStatus.WAITING


class VllmRequestView:
    """A live vLLM ``Request`` as the reference connector's ``RequestView`` (no copies)."""

    __slots__ = ("_request",)

    def __init__(self, request) -> None:
        self._request = request

    @property
    def req_id(self) -> str:
        return self._request.request_id

    @property
    def all_token_ids(self):
        return self._request.all_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return self._request.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        return self._request.num_tokens

    @property
    def num_computed_tokens(self) -> int:
        return self._request.num_computed_tokens

    @property
    def status(self) -> RequestStatus:
        return project_status(self._request.status)

    @property
    def block_hashes(self):
        return self._request.block_hashes

    @property
    def shared_prefix_boundary(self) -> int:
        return getattr(self._request, "shared_prefix_boundary", 0)  # vLLM >= 0.29


def project_scheduler_output(scheduler_output, step: int, hybrid: bool = False) -> SchedulerOutput:
    """vLLM's output of one ``schedule()`` as the reference connector's ``SchedulerOutput``.

    New and resumed requests carry their whole block table, running ones the appended blocks
    (``CachedRequestData.new_block_ids``), group 0's, or with ``hybrid`` every group's. vLLM keeps
    finished and preempted ids in sets. Finished ids keep the set's order, as vLLM's own
    connector walks them (final stores, then ``on_request_finished``): under a pinned
    ``PYTHONHASHSEED`` it is the simulator's order (``kvoffload.engine.set_order``). Preempted
    ids only add jobs to a flush set; they are sorted. A Mamba group's boundary states come from
    the scheduler's hand-off (``kv_connector_block_state.boundary_state_offloads``, vLLM 0.29+),
    which vLLM clears once the connector planned the step.
    """
    new_block_ids = {}
    for req_id, groups, _resumed in yield_req_data(scheduler_output):
        if groups:
            new_block_ids[req_id] = tuple(tuple(ids) for ids in groups) if hybrid else tuple(groups[0])
    return SchedulerOutput(
        step=step,
        num_scheduled_tokens=scheduler_output.num_scheduled_tokens,
        new_block_ids=new_block_ids,
        finished_req_ids=tuple(scheduler_output.finished_req_ids or ()),
        preempted_req_ids=tuple(sorted(scheduler_output.preempted_req_ids or ())),
        boundary_states=_boundary_states(scheduler_output),
    )


def _boundary_states(scheduler_output) -> dict[str, tuple[tuple[int, int, int], ...]]:
    block_state = getattr(scheduler_output, "kv_connector_block_state", None)
    offers = getattr(block_state, "boundary_state_offloads", None) if block_state is not None else None
    return {req_id: tuple(tuple(entry) for entry in entries) for req_id, entries in (offers or {}).items()}


@dataclass
class StepPlanMetadata(KVConnectorMetadata):
    """Scheduler side -> worker side, once per step."""

    plan: StepPlan


@dataclass
class CompletedJobsMetadata(KVConnectorWorkerMetadata):
    """Worker side -> scheduler side: the jobs this worker finished since its last report.

    With several workers vLLM aggregates one object per worker; each job is then listed once
    per worker, which is what the reference scheduler counts acknowledgements by.
    """

    results: list[TransferResult] = field(default_factory=list)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "CompletedJobsMetadata":
        assert isinstance(other, CompletedJobsMetadata)
        return CompletedJobsMetadata(self.results + other.results)
