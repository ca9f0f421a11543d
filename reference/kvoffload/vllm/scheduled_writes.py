"""Store submission delays in vLLM's own engine loop (``--engine vllm``), from what its scheduler
and the connector's transfer handler report.

The ``vllm-scheduler`` replay drives the scheduler and the worker itself, so it tells
:class:`~kvoffload.vllm.observe.StoreSubmitDelays` what each step wrote. In the real engine
``EngineCore.step`` (vllm/v1/engine/core.py) runs ``schedule()``, the model, then
``update_from_output()``; with the engine core in this process the replay wraps the two
scheduler calls of its instance:

- ``schedule()``: the blocks this step hands out (``allocated``), and each scheduled request's
  block table and first position, kept from the scheduler output as the model runner keeps
  its input batch (``model.BlockTables``);
- ``update_from_output()``: the positions the forward wrote for good: the step's tokens, less
  the drafts the sampler rejected (``sampled_token_ids`` holds the accepted drafts and the
  bonus token), as the replay counts them.

The submissions themselves are seen at the transfer handler (``StoreSubmitDelays.attach``), in the
worker's calls inside the same ``step()``. Sync scheduling only: under async scheduling a step's
output is processed after the next step was scheduled and launched, so a store can be submitted
before the writes it copies are known here (vLLM's CPU platform turns async scheduling off).
"""

from __future__ import annotations

from kvoffload.vllm.model import BlockTables
from kvoffload.vllm.observe import StoreSubmitDelays


class ScheduledWrites:
    """Feeds ``delays`` from one vLLM scheduler instance; ``delays.step`` is the engine
    iteration, set by the replay before each ``step()``."""

    def __init__(self, scheduler, delays: StoreSubmitDelays):
        self.delays = delays
        self.tables = BlockTables()
        self._scheduled = None  # (step, output, {request: first position}) until its update
        schedule, update = scheduler.schedule, scheduler.update_from_output

        def observed_schedule(*args, **kwargs):
            output = schedule(*args, **kwargs)
            self.delays.allocated(output)
            self._scheduled = (self.delays.step, output, self.tables.update(output))
            return output

        def observed_update(scheduler_output, model_output):
            if self._scheduled is not None and self._scheduled[1] is scheduler_output:
                self._written(*self._scheduled, model_output)
                self._scheduled = None
            return update(scheduler_output, model_output)

        scheduler.schedule = observed_schedule
        scheduler.update_from_output = observed_update

    def _written(self, step: int, scheduler_output, starts: dict[str, int], model_output) -> None:
        drafts_of = scheduler_output.scheduled_spec_decode_tokens or {}
        index_of = model_output.req_id_to_index or {}
        sampled = model_output.sampled_token_ids or []
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            drafts = len(drafts_of.get(req_id, ()))
            accepted = 0
            if drafts and req_id in index_of and index_of[req_id] < len(sampled):
                accepted = max(0, len(sampled[index_of[req_id]]) - 1)  # the bonus token is not a draft
            start = starts[req_id]
            self.delays.written(step, self.tables.tables[req_id], start, start + count - drafts + accepted)
