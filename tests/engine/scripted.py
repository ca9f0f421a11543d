"""A scheduler model driven step by step, with a connector that is a script: the engine stories'
shared helpers (block size 4 throughout)."""

from __future__ import annotations

from kvoffload.engine.block_pool import BlockPool
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.cost import profile
from kvoffload.engine.live import LiveRequest
from kvoffload.engine.observer import RunObserver
from kvoffload.engine.requests import RequestSpec
from kvoffload.engine.scheduler import SchedulerModel

BS = 4


class ScriptedConnector:
    """Answers lookups from ``hits[req_id]`` (a list, consumed in order; None defers)."""

    def __init__(self, hits: dict[str, list[int | None]] | None = None):
        self.hits = hits or {}

    def on_new_request(self, req) -> None:
        pass

    def get_num_new_matched_tokens(self, req, num_local):
        answers = self.hits.get(req.req_id)
        hits = answers.pop(0) if answers else 0
        return hits, bool(hits)

    def update_state_after_alloc(self, req, block_ids, num_external_tokens) -> None:
        pass

    def request_finished(self, req, block_ids=()) -> bool:
        return False


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))


def model(connector=None, **settings) -> SchedulerModel:
    config = EngineConfig(gpu_blocks=settings.pop("gpu_blocks", 32), block_size=BS, **settings)
    observer = RunObserver(profile(config.profile), BS, config.tokens_per_chunk, trace=False)
    return SchedulerModel(config, BlockPool(config.gpu_blocks, BS), connector or ScriptedConnector(),
                          observer, on_finished=lambda live, step: None)


def arrive(scheduler: SchedulerModel, req_id: str, prompt: int, output: int = 4) -> LiveRequest:
    spec = RequestSpec(req_id, tokens(len(scheduler.live) + 1, prompt), tokens(99, output))
    live = LiveRequest.create(spec, BS, 0)
    scheduler.add(live)
    return live


def step(scheduler: SchedulerModel, number: int = 0):
    out, scheduled, _ = scheduler.schedule(number)
    scheduler.after_schedule(scheduled)
    return out, scheduled


def land(scheduler: SchedulerModel, live: LiveRequest) -> None:
    scheduler.load_landed(live, 0)
