"""A trace is read as a stream: its requests are built when the replay reaches them and dropped
when they finish, and the streamed workload is the workload an eager loader would build."""

from __future__ import annotations

import json
import random
import weakref
from array import array
from pathlib import Path

import pytest

from kvoffload.core.fixes import Fixes
from kvoffload.engine.engine import Engine
from kvoffload.engine.requests import RequestSpec
from kvoffload.workloads import load_workload, reusable_prompt_share
from kvoffload.workloads import mooncake
from kvoffload.workloads.stream import RequestStream
from kvoffload.workloads.tokens import random_tokens

SEED = 7  # the multi-turn definition's seed, which mooncake:FILE takes


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    """rows: (timestamp ms, input_length, output_length, hash_ids)."""
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                            for t, i, o, h in rows))
    return path


def eager_model(path: Path, ms_per_step: float = 20.0) -> list[RequestSpec]:
    """The trace built whole, independently of the loader: each line's prompt is its blocks'
    seeded tokens, its answer seeded by its line number, both int32 arrays; stable order by arrival step."""
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    first = min(line["timestamp"] for line in lines)
    width = len(str(len(lines)))
    specs = []
    for number, line in enumerate(lines, start=1):
        prompt = array("i")
        for hash_id in line["hash_ids"]:
            prompt += random_tokens(random.Random(f"mooncake-block/{SEED}/{hash_id}"), 512)
        output = random_tokens(random.Random(f"mooncake-output/{SEED}/{number}"), line["output_length"])
        specs.append(RequestSpec(f"mc-{number:0{width}d}", prompt[: line["input_length"]],
                                 output, arrival_step=round((line["timestamp"] - first) / ms_per_step)))
    return sorted(specs, key=lambda spec: spec.arrival_step)


def shuffled_trace(tmp_path: Path) -> Path:
    """Out of timestamp order, with shared prefix blocks (ids 1, 2) and equal timestamps."""
    return write_trace(tmp_path / "t.jsonl", [
        (400, 1100, 20, [1, 2, 30]), (0, 600, 7, [1, 2]), (400, 513, 3, [1, 40]), (120, 40, 9, [50]),
        (20, 1536, 5, [1, 2, 60]), (0, 512, 11, [70]),
    ])


def test_a_streamed_trace_is_the_trace_an_eager_loader_builds(tmp_path, monkeypatch):
    trace = shuffled_trace(tmp_path)
    workload = load_workload(f"mooncake:{trace}", {"gpu_blocks": "auto"})
    assert isinstance(workload.requests, RequestStream) and len(workload.requests) == 6
    expected = eager_model(trace)
    assert list(workload.requests) == expected
    assert list(workload.requests) == expected  # every pass builds the same requests
    monkeypatch.setattr(mooncake._BlockTokens, "CAPACITY", 1)  # blocks evicted and drawn again
    assert list(load_workload(f"mooncake:{trace}").requests) == expected
    assert workload.requests[2] == expected[2] and workload.requests[-1] == expected[-1]


def test_the_reuse_bound_of_a_stream_equals_that_of_its_requests_in_memory(tmp_path):
    trace = shuffled_trace(tmp_path)
    streamed = load_workload(f"mooncake:{trace}", {"gpu_blocks": "auto"})
    in_memory = type(streamed)(**{**streamed.__dict__, "requests": tuple(streamed.requests)})
    share = reusable_prompt_share(streamed)
    assert share == reusable_prompt_share(in_memory) and 0 < share < 1


def spaced_trace(tmp_path: Path, count: int = 12) -> Path:
    """Short requests arriving every 3 steps (60 ms), two at a time, sharing a first block."""
    rows = [(60 * (i // 2), 48 + i, 4 + i % 3, [1]) for i in range(count)]
    return write_trace(tmp_path / "spaced.jsonl", rows)


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_requests_are_built_at_their_arrival_and_dropped_when_they_finish(tmp_path, scheduling):
    workload = load_workload(f"mooncake:{spaced_trace(tmp_path)}", {"scheduling": scheduling})
    stream = workload.requests
    built: dict[str, weakref.ref] = {}

    def tracked_pass():  # the loader's own pass, remembering each built request weakly
        for step, build in stream.arrivals():
            def build_tracked(build=build):
                spec = build()
                built[spec.req_id] = weakref.ref(spec)
                return spec
            yield step, build_tracked

    tracked = RequestStream(len(stream), stream.longest, tracked_pass)
    arrival_steps = sorted(spec.arrival_step for spec in stream)
    seen = []

    def on_step(step: int, finished: int) -> None:  # after a step: ``step`` is the next one
        alive = {req_id for req_id, ref in built.items() if ref() is not None}
        seen.append((step, engine.feed.num_built, alive, set(engine.scheduler.live), finished))

    engine = Engine(tracked, workload.engine, Fixes(), on_step=on_step, skip_idle=False)
    record = engine.run()
    assert record.crash is None and record.finished_requests == 12
    for step, num_built, alive, live, finished in seen:
        assert num_built == sum(arrival < step for arrival in arrival_steps)  # built on arrival, not before
        assert alive == live  # a finished request is gone at once (first turns: no follow-up reads it)
    assert max(len(live) for _, _, _, live, _ in seen) >= 2
    assert min(finished for *_, finished in seen[-3:]) > 0 and not any(ref() for ref in built.values())
