"""Probes for the mutants ``fates.py`` calls equivalent: each runs the original and the mutated
expression over every input the guarded code can see and asserts they agree.

    .venv/bin/python scripts/mutation_tool/probes.py
"""

from __future__ import annotations


def one_key_index() -> None:
    """core/manager.py prepare_store: ``len(keys) == 1 and keys[0] not in chunks`` vs ``keys[-1]``."""
    chunks = {b"a": 1}
    for keys in ([b"a"], [b"b"], (b"a",), [b"a", b"b"], [], [b"b", b"a"]):
        for free in (0, 1):
            original = len(keys) == 1 and keys[0] not in chunks and free
            mutant = len(keys) == 1 and keys[-1] not in chunks and free
            assert original == mutant, keys


def store_filter_or() -> None:
    """core/stores.py StorePlanner.build: the decode-step filter ``state is not None and
    watermark >= boundary and num_tokens >= boundary`` with its last ``and`` made ``or``. The
    requests the mutant lets through more have a watermark below their next chunk's end, and
    ``_store_request`` returns for them without a change: on the -small workloads and chunked prefills, each such
    request is handed to it after the real build, and nothing it owns may move."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.core.stores import StorePlanner
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.engine import Engine
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.workloads import load_workload

    build = StorePlanner.build
    extra_calls = 0

    def probed(self, requests, out, allocated, flush):
        nonlocal extra_calls
        jobs = build(self, requests, out, allocated, flush)
        for req_id, num_scheduled in out.num_scheduled_tokens.items():
            state = requests.get(req_id)
            if state is None or state.req.num_computed_tokens + num_scheduled >= state.store_boundary:
                continue  # the original lets it through (or the mutant too would fail on None)
            if len(state.req.all_token_ids) < state.store_boundary:
                continue  # the mutant filters it out as well
            before = (state.next_stored_chunk, state.store_boundary, self.manager.num_chunks,
                      self.stats.store_jobs, self.stats.store_allocation_failures)
            extra: list = []
            self._store_request(state, num_scheduled, set(allocated), set(flush), extra)
            after = (state.next_stored_chunk, state.store_boundary, self.manager.num_chunks,
                     self.stats.store_jobs, self.stats.store_allocation_failures)
            assert extra == [] and before == after, (req_id, before, after)
            extra_calls += 1
        return jobs

    # Chunked prefills are where the watermark trails the tokens: 40-token prompts, 8 a step.
    chunked = EngineConfig(gpu_blocks=64, cpu_chunks=64, block_size=4, max_num_batched_tokens=8)
    prompts = [RequestSpec(f"r{i}", tuple(range(3 + i, 43 + i)), (7, 8, 9), arrival_step=i) for i in range(4)]
    StorePlanner.build = probed
    try:
        runs = [(load_workload(name).requests, load_workload(name).engine)
                for name in ("multi-turn-small", "shared-prefix-small", "spec-decode-small")]
        for requests, config in runs + [(prompts, chunked), (prompts, chunked.replace(scheduling="async"))]:
            record = Engine(requests, config, Fixes(), max_steps=200_000).run()
            assert record.crash is None, record.crash
    finally:
        StorePlanner.build = build
    assert extra_calls > 0, "the probe never met a request the mutant lets through"
    print(f"    {extra_calls} calls the mutant adds, none changed anything")


def trace_pid() -> None:
    """engine/observer.py plan_built: the trace events' ``"pid": 0`` made 1. Chrome's trace
    format groups rows by (pid, tid); the observer is the only writer of trace events and gives
    all of them one pid, so any constant draws the same rows: one process, one row per request."""
    import re
    from pathlib import Path

    observer = Path(__file__).resolve().parents[2] / "reference" / "kvoffload" / "engine" / "observer.py"
    writers = [path for path in (observer.parents[1]).rglob("*.py") if re.search(r'"pid":', path.read_text())]
    assert writers == [observer], writers
    assert observer.read_text().count('"pid":') == 1


PROBES = [one_key_index, store_filter_or, trace_pid]

if __name__ == "__main__":
    for probe in PROBES:
        probe()
        print(f"ok  {probe.__name__}")
