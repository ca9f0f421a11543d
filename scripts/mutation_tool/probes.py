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


def admitted_without_placeholders() -> None:
    """engine/scheduler.py _schedule_waiting: ``asynchronous = scheduling == "async"`` made
    ``is not "async"``. The flag there only adds ``live.placeholders`` to the known tokens of a
    request joining the step from the queue, and such a request has none: a new one never ran,
    and a preempted one was no victim while it had output in flight (the async victim rule).
    Checked at every admission of the -small workloads and of tight-pool preemption runs, sync
    and async."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.engine.admission import Admission
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.engine import Engine
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.workloads import load_workload

    admit = Admission.admit
    admissions = 0

    def probed(self, budget, join_step):
        def checked(live, count):
            nonlocal admissions
            assert live.placeholders == 0, (live.req_id, live.placeholders)
            admissions += 1
            join_step(live, count)
        return admit(self, budget, checked)

    tight = EngineConfig(gpu_blocks=9, cpu_chunks=64, block_size=4, max_num_batched_tokens=16, reserve_full_isl=False)
    crowd = [RequestSpec(f"r{i}", tuple(range(3 + i, 15 + i)), tuple(range(40, 52)), arrival_step=i % 3)
             for i in range(6)]
    Admission.admit = probed
    try:
        runs = [(load_workload(name).requests, load_workload(name).engine)
                for name in ("multi-turn-small", "shared-prefix-small", "spec-decode-small")]
        runs += [(requests, config.replace(scheduling=other)) for requests, config in list(runs)
                 for other in ("sync", "async") if other != config.scheduling]
        for scheduling in ("sync", "async"):
            runs.append((crowd, tight.replace(scheduling=scheduling)))
        preemptions = 0
        for requests, config in runs:
            record = Engine(requests, config, Fixes(), max_steps=200_000).run()
            assert record.crash is None, record.crash
            preemptions += record.preemptions
    finally:
        Admission.admit = admit
    assert preemptions > 0, "no preemption: the probe did not reach re-admissions"
    print(f"    {admissions} admissions, {preemptions} preemptions: no placeholders at any")


def enum_identity() -> None:
    """worker/connector.py: ``kind is TransferKind.STORE`` made ``==``. ``kind`` is a TransferKind
    or None; a plain Enum compares by identity, so both agree on every value it can hold."""
    from kvoffload.core.types import TransferKind

    for kind in (*TransferKind, None):
        for member in TransferKind:
            assert (kind is member) == (kind == member)
    assert TransferKind.__eq__ is object.__eq__ or TransferKind.__eq__.__qualname__.startswith("Enum")


def aligned_hits() -> None:
    """engine/admission.py _admit_new: ``count = 0 if hits else ...`` made ``-1 if hits``. The count
    is returned only without hits; with hits it enters ``cdiv(num_local + hits + count, bs)``,
    and ``cdiv(x - 1, bs) == cdiv(x, bs)`` for every positive multiple x of bs. x is one: the GPU
    prefix is whole blocks and the connector's hit ends on a chunk boundary, a chunk being whole
    blocks (core/scheduler.py ``_lookup``). Checked at every hit of the -small workloads, sync and
    async, and of a run with two blocks per chunk and a GPU prefix ending mid-chunk."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.core.scheduler import ReferenceConnectorScheduler
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.engine import Engine
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.workloads import load_workload

    matched = ReferenceConnectorScheduler.get_num_new_matched_tokens
    hits_seen = mid_chunk = 0

    def probed(self, req, num_local):
        nonlocal hits_seen, mid_chunk
        hits, is_async = matched(self, req, num_local)
        if hits:
            bs = self.config.block_size
            assert num_local % bs == 0 and hits % bs == 0, (req.req_id, num_local, hits, bs)
            hits_seen += 1
            mid_chunk += num_local % self.config.tokens_per_chunk != 0
        return hits, is_async

    two_block_chunks = EngineConfig(gpu_blocks=12, cpu_chunks=64, block_size=4, blocks_per_chunk=2,
                                    max_num_batched_tokens=16)
    shared = tuple(range(100, 120))
    repeats = [RequestSpec(f"r{i}", shared[:18 + i % 3] + (i,), (7, 8), arrival_step=6 * i) for i in range(8)]
    ReferenceConnectorScheduler.get_num_new_matched_tokens = probed
    try:
        runs = [(load_workload(name).requests, load_workload(name).engine)
                for name in ("multi-turn-small", "shared-prefix-small", "spec-decode-small")]
        runs += [(requests, config.replace(scheduling=other)) for requests, config in list(runs)
                 for other in ("sync", "async") if other != config.scheduling]
        runs += [(repeats, two_block_chunks.replace(scheduling=mode)) for mode in ("sync", "async")]
        for requests, config in runs:
            record = Engine(requests, config, Fixes(), max_steps=200_000).run()
            assert record.crash is None, record.crash
    finally:
        ReferenceConnectorScheduler.get_num_new_matched_tokens = matched
    assert hits_seen > 0, "no connector hit: the probe did not reach the mutated line"
    print(f"    {hits_seen} connector hits ({mid_chunk} after a GPU prefix ending mid-chunk), every one whole "
          "blocks after a whole-block GPU prefix")


PROBES = [one_key_index, store_filter_or, trace_pid, admitted_without_placeholders, enum_identity, aligned_hits]

if __name__ == "__main__":
    for probe in PROBES:
        probe()
        print(f"ok  {probe.__name__}")
