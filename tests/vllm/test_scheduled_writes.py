"""What vLLM's engine loop wrote in a step, as ``--engine vllm`` tells the store delays
(kvoffload/vllm/scheduled_writes.py), on a stand-in scheduler (no vLLM needed): every scheduled
token of a plain request, and of a request with drafts only the accepted ones."""

from __future__ import annotations

from types import SimpleNamespace

from kvoffload.vllm.scheduled_writes import ScheduledWrites


class Delays:
    """What the observer reports to (StoreSubmitDelays' two calls), recorded."""

    step = 7

    def __init__(self):
        self.written_calls = []

    def allocated(self, output):
        pass

    def written(self, step, table, start, end):
        self.written_calls.append((step, tuple(table), start, end))


class Tables:
    """The block tables and first positions the scheduler output gives (model.BlockTables)."""

    tables = {"plain": [3, 4], "drafting": [5, 6]}

    def update(self, output):
        return {"plain": 10, "drafting": 20}


def test_a_plain_request_wrote_every_scheduled_token_and_a_drafting_one_its_accepted_drafts():
    # plain: 1 token from position 10. drafting: 1 token and 3 drafts from 20, of which the
    # sampler kept 1 (a draft and the bonus token): positions 20-21 hold KV for good.
    output = SimpleNamespace(num_scheduled_tokens={"plain": 1, "drafting": 4},
                             scheduled_spec_decode_tokens={"drafting": [11, 12, 13]})
    model_output = SimpleNamespace(req_id_to_index={"plain": 0, "drafting": 1}, sampled_token_ids=[[9], [9, 9]])
    scheduler = SimpleNamespace(schedule=lambda: output, update_from_output=lambda out, model: "updated")
    delays = Delays()
    writes = ScheduledWrites(scheduler, delays)
    writes.tables = Tables()
    assert scheduler.schedule() is output
    assert scheduler.update_from_output(output, model_output) == "updated"
    assert delays.written_calls == [(7, (3, 4), 10, 11), (7, (5, 6), 20, 22)]
