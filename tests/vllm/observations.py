"""What the reference connector's scheduler side decided, per request: the same wrapper on
either engine's ReferenceConnectorScheduler (the differential compares the two)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class CoreObservations:
    """Per request, what the reference connector's scheduler side decided."""

    first_admission: dict[str, tuple[int, int]] = field(default_factory=dict)  # GPU hit, connector hit
    chunks_stored: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    chunks_loaded: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    flushed_jobs: set[int] = field(default_factory=set)  # store jobs a plan named in jobs_to_flush

    def of(self, req_id: str) -> tuple:
        return (self.first_admission.get(req_id), self.chunks_stored[req_id], self.chunks_loaded[req_id])


def observe_core(core) -> CoreObservations:
    """Wrap a ReferenceConnectorScheduler's calls (either engine drives the same class)."""
    seen = CoreObservations()
    local_at_lookup: dict[str, int] = {}
    lookup, after_alloc, build = core.get_num_new_matched_tokens, core.update_state_after_alloc, core.build_connector_meta

    def observed_lookup(req, num_local):
        local_at_lookup[req.req_id] = num_local
        return lookup(req, num_local)

    def observed_after_alloc(req, block_ids, num_external):
        seen.first_admission.setdefault(req.req_id, (local_at_lookup.get(req.req_id, 0), num_external))
        return after_alloc(req, block_ids, num_external)

    def observed_build(out):
        plan = build(out)
        for job in plan.store_jobs:
            seen.chunks_stored[job.req_id] += len(job.chunk_slots)
        for job in plan.load_jobs:
            seen.chunks_loaded[job.req_id] += len(job.chunk_slots)
        seen.flushed_jobs.update(plan.jobs_to_flush)
        return plan

    core.get_num_new_matched_tokens = observed_lookup
    core.update_state_after_alloc = observed_after_alloc
    core.build_connector_meta = observed_build
    return seen
