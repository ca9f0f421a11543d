"""The probes that replay: each runs the engine with the mutant's code beside the original (or
watches every input the mutated line sees) on the -small workloads and a few stories, and
asserts the records agree. Run by ``probes.py`` with the others."""

from __future__ import annotations


def _replays() -> list:
    """(requests, engine config) of the -small workloads, each under both schedulings."""
    from kvoffload.workloads import load_workload

    runs = [(load_workload(name).requests, load_workload(name).engine)
            for name in ("multi-turn-small", "shared-prefix-small", "spec-decode-small")]
    return [(requests, config.replace(scheduling=mode)) for requests, config in runs for mode in ("sync", "async")]


def _replay_clean(runs: list) -> None:
    """Replay each (requests, engine config) with every fix on; none may crash."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.engine.engine import Engine

    for requests, config in runs:
        record = Engine(requests, config, Fixes(), max_steps=200_000).run()
        assert record.crash is None, record.crash


def _mutated_method(cls, name: str, original: str, mutant: str):
    """``cls.name`` compiled from its own source with ``original`` (found once) made ``mutant``:
    the method as the mutant has it, in its module's namespace."""
    import inspect
    import sys
    import textwrap

    module = sys.modules[cls.__module__]
    source = textwrap.dedent(inspect.getsource(getattr(cls, name)))
    assert source.count(original) == 1, original
    namespace = dict(vars(module))
    exec(compile(source.replace(original, mutant), module.__file__, "exec"), namespace)
    return namespace[name]


def _records_with_each(cls, name: str, methods, records):
    """``records()`` once with each of ``methods`` in turn as ``cls.name``; the original is put
    back whatever happens."""
    original = getattr(cls, name)
    try:
        results = []
        for method in methods:
            setattr(cls, name, method)
            results.append(records())
        return results
    finally:
        setattr(cls, name, original)


def _outcome(requests, config, fixes=None, **engine_options) -> tuple:
    """A traced replay's deterministic metrics, trace, invariant reports and crash."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.engine.engine import Engine
    from kvoffload.metrics import MEASURED_METRICS, compute_metrics

    record = Engine(requests, config, fixes or Fixes(), max_steps=200_000, trace=True, **engine_options).run()
    metrics = compute_metrics(record)
    return ({name: value for name, value in metrics.items() if name not in MEASURED_METRICS}, record.trace_events,
            record.invariant_violations, record.crash)


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


def aligned_hits() -> None:
    """engine/admission.py _admit_new: ``count = 0 if hits else ...`` made ``-1 if hits``. The count
    is returned only without hits; with hits it enters ``cdiv(num_local + hits + count, bs)``,
    and ``cdiv(x - 1, bs) == cdiv(x, bs)`` for every positive multiple x of bs. x is one: the GPU
    prefix is whole blocks and the connector's hit ends on a chunk boundary, a chunk being whole
    blocks (core/scheduler.py ``_lookup``). Checked at every hit of the -small workloads, sync and
    async, and of a run with two blocks per chunk and a GPU prefix ending mid-chunk."""
    from kvoffload.core.scheduler import ReferenceConnectorScheduler
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.requests import RequestSpec

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
        _replay_clean(_replays() + [(repeats, two_block_chunks.replace(scheduling=mode)) for mode in ("sync", "async")])
    finally:
        ReferenceConnectorScheduler.get_num_new_matched_tokens = matched
    assert hits_seen > 0, "no connector hit: the probe did not reach the mutated line"
    print(f"    {hits_seen} connector hits ({mid_chunk} after a GPU prefix ending mid-chunk), every one whole "
          "blocks after a whole-block GPU prefix")


def live_identity() -> None:
    """engine/live.py: ``@dataclass(eq=False)`` made ``eq=True`` on LiveRequest. Field equality
    then replaces identity, and the class loses its hash. Field equality is identity: each live
    request owns the Request ``create`` built for it, and Request compares by identity. Nothing
    hashes a live request. Both checked under the mutant's own semantics (field-wise ``==``,
    ``__hash__ = None``) on every comparison of the -small workloads, sync and async, and of a
    tight pool that preempts."""
    import dataclasses

    from kvoffload.core.request import Request
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.live import LiveRequest
    from kvoffload.engine.requests import RequestSpec

    assert Request.__eq__ is object.__eq__
    names = [f.name for f in dataclasses.fields(LiveRequest)]
    comparisons = 0

    def field_eq(self, other):
        nonlocal comparisons
        if other.__class__ is not self.__class__:
            return NotImplemented
        same = tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)
        assert same == (self is other), (self.req_id, other.req_id)
        comparisons += 1
        return same

    tight = EngineConfig(gpu_blocks=9, cpu_chunks=64, block_size=4, max_num_batched_tokens=16, reserve_full_isl=False)
    crowd = [RequestSpec(f"r{i}", tuple(range(3 + i, 15 + i)), tuple(range(40, 52)), arrival_step=i % 3)
             for i in range(6)]
    saved = LiveRequest.__eq__, LiveRequest.__hash__
    LiveRequest.__eq__, LiveRequest.__hash__ = field_eq, None
    try:
        _replay_clean(_replays() + [(crowd, tight.replace(scheduling=mode)) for mode in ("sync", "async")])
    finally:
        LiveRequest.__eq__, LiveRequest.__hash__ = saved
    assert comparisons > 0, "no live request was compared: the probe did not reach the queues"
    print(f"    {comparisons} comparisons of live requests, each one identity; none hashed")


def async_commit_guard() -> None:
    """engine/scheduler.py update_from_output: the async cache_blocks guard
    ``(num_computed - placeholders) // bs > num_committed_blocks`` with ``-`` made ``<<``. With
    placeholders >= 0 the shifted value is never smaller, so the mutant's guard holds wherever
    the original's does; where only the mutant's holds, ``commit_computed`` (which takes
    ``num_computed - placeholders`` and checks the same count itself) commits nothing. Checked
    by running the mutated method itself beside the original on the -small workloads, sync and
    async: every record equal, metrics and trace; and placeholders never negative there."""
    from kvoffload.engine.scheduler import SchedulerModel

    original = SchedulerModel.update_from_output
    guard = "(req.num_computed_tokens - live.placeholders) // bs > live.num_committed_blocks"
    mutated = _mutated_method(SchedulerModel, "update_from_output", guard, guard.replace(" - ", " << ", 1))
    negative = 0

    def watched(self, output):
        nonlocal negative
        negative += sum(item.live.placeholders < 0 for item in output.scheduled)
        return mutated(self, output)

    runs = _replays()
    before = [_outcome(requests, config) for requests, config in runs]
    SchedulerModel.update_from_output = watched
    try:
        after = [_outcome(requests, config) for requests, config in runs]
    finally:
        SchedulerModel.update_from_output = original
    assert before == after and all(crash is None for *_, crash in before)
    assert negative == 0, negative
    print(f"    {len(runs)} replays: the same metrics and traces with the mutated guard")


def finish_refresh() -> None:
    """core/scheduler.py request_finished: ``if self.fixes.last_block_at_finish: state.refresh_keys(..)``
    made ``if not``. The keys a refresh appends are read by the lookup and the store path, each
    of which refreshes first (get_num_new_matched_tokens; stores.py _store_request before it
    takes a key), and by the cursor check, which more keys only satisfy. A finished request is
    never looked up again; its finish-time store (the flag's, PR #48596) goes through
    _store_request. So refreshing at the finish or not changes nothing, flag on or off. Checked:
    the mutated method beside the original on the -small workloads, sync and async, with every
    fix, with last_block_at_finish off, and under the 0.25 preset (touch-on-access, the rewinding
    cursor): the same metrics, traces and invariant reports; and the refresh at the finish does
    add keys in these runs."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.core.scheduler import ReferenceConnectorScheduler

    original = ReferenceConnectorScheduler.request_finished
    mutated = _mutated_method(ReferenceConnectorScheduler, "request_finished",
                              "if self.fixes.last_block_at_finish:\n", "if not self.fixes.last_block_at_finish:\n")
    keys_added = 0

    def counting(method):
        def counted(self, req, block_ids=()):
            nonlocal keys_added
            state = self._requests.get(req.req_id)
            if state is not None:  # what a refresh at this point appends, whichever method runs
                known = len(state.offload_keys)
                keys_added += (len(state.req.block_hashes) // self.config.blocks_per_chunk) - known > 0
            return method(self, req, block_ids)
        return counted

    runs = [(requests, config, fixes) for requests, config in _replays()
            for fixes in (Fixes(), Fixes().without("last_block_at_finish"), Fixes.preset("vllm-0.25"))]
    before, after = _records_with_each(ReferenceConnectorScheduler, "request_finished",
                                       (counting(original), counting(mutated)),
                                       lambda: [_outcome(*run) for run in runs])
    assert before == after
    assert keys_added > 0, "no finish found keys to refresh: the probe did not reach the difference"
    print(f"    {len(runs)} replays: the same records; {keys_added // 2} finishes with keys left to refresh")


def reset_forgets_the_state() -> None:
    """core/scheduler.py reset_cache: a finished request's ``state.finish_signalled = True`` made
    ``False`` before ``del self._requests[req_id]``. The flag is read only on states looked up in
    ``self._requests`` (build_connector_meta, _release_if_done through it or a completion's
    lookup), and the state is deleted from it on the next line. Checked: the mutated method
    beside the original on replays with a reset every few steps (the -small workloads, sync and
    async, and K02's finish-then-reset), the same records; and the line is reached."""
    from kvoffload.core.scheduler import ReferenceConnectorScheduler
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.requests import RequestSpec

    original = ReferenceConnectorScheduler.reset_cache
    mutated = _mutated_method(ReferenceConnectorScheduler, "reset_cache", "state.finish_signalled = True",
                              "state.finish_signalled = False")
    reached = 0

    def counting(method):
        def counted(self):
            nonlocal reached
            reached += sum(state.req.status.is_finished and not state.finish_signalled
                           for state in self._requests.values())
            return method(self)
        return counted

    tiny = EngineConfig(gpu_blocks=16, cpu_chunks=16, block_size=4, store_completion_steps=4)
    finish_then_reset = [RequestSpec("A", tuple(range(1, 9)), (2,))]
    runs = [(requests, config, range(3, 400, 5)) for requests, config in _replays()]
    runs += [(finish_then_reset, tiny.replace(scheduling=mode), (at,)) for mode in ("sync", "async") for at in (1, 2)]
    before, after = _records_with_each(
        ReferenceConnectorScheduler, "reset_cache", (counting(original), counting(mutated)),
        lambda: [_outcome(requests, config, reset_cache_at=at) for requests, config, at in runs])
    assert before == after
    assert reached > 0, "no reset met a finished, unsignalled request: the probe did not reach the line"
    print(f"    {len(runs)} replays with resets: the same records; the line ran {reached // 2} times")


def _preempting_replays() -> list:
    """(requests, engine config) of multi-turn-small in a small pool with slow copies, both
    schedulings: preemptions give requests new block tables while their stores wait to be copied."""
    from kvoffload.workloads import load_workload

    settings = {"gpu_blocks": "28", "store_completion_steps": "6", "blocks_per_chunk": "1"}
    return [(workload.requests, workload.engine) for workload in
            (load_workload("multi-turn-small", {**settings, "scheduling": mode}) for mode in ("sync", "async"))]


def held_set_rebuilt() -> None:
    """engine/scheduler.py blocks_held_by: the kept set's ``kept[0] is not blocks`` made
    ``kept[1] is not blocks``. kept[1] is the table's length, an int, never the table: the
    mutant rebuilds ``set(blocks)`` on every call instead of growing the kept one. The same
    answer wherever the kept set equals its table: checked at every call (the fence check's) on
    the -small workloads and on preempting replays with copies in flight, sync and async."""
    from kvoffload.engine.scheduler import SchedulerModel

    original = SchedulerModel.blocks_held_by
    calls = 0

    def checked(self, req_id):
        nonlocal calls
        held = original(self, req_id)
        owner = self.live.get(req_id)
        assert set(held) == (set(owner.blocks) if owner is not None else set()), req_id
        calls += 1
        return held

    SchedulerModel.blocks_held_by = checked
    try:
        _replay_clean(_replays() + _preempting_replays())
    finally:
        SchedulerModel.blocks_held_by = original
    assert calls > 100, calls
    print(f"    {calls} calls: each kept set equal to the set of its table")


def joins_without_placeholders() -> None:
    """engine/scheduler.py _schedule_waiting: ``asynchronous = scheduling == "async"`` made ``is not``.
    It only decides whether a joining request's ``known`` tokens add its placeholders, and a
    request joins from the waiting queues with none (a new one, a loaded one, or one whose
    preemption dropped its outputs in flight): both sides of the test give the same count.
    Checked: every join of the -small workloads and of preempting replays, sync and async, has
    no placeholders, and the mutated method beside the original gives the same records."""
    from kvoffload.engine.admission import Admission
    from kvoffload.engine.scheduler import SchedulerModel

    original_admit, original_method = Admission.admit, SchedulerModel._schedule_waiting
    mutated = _mutated_method(SchedulerModel, "_schedule_waiting", 'asynchronous = self.config.scheduling == "async"',
                              'asynchronous = self.config.scheduling is not "async"')
    joins = 0

    def admit(self, budget, join_step):
        def checked(live, count):
            nonlocal joins
            assert live.placeholders == 0, (live.req_id, live.placeholders)
            joins += 1
            return join_step(live, count)
        return original_admit(self, budget, checked)

    runs = _replays() + _preempting_replays()
    Admission.admit = admit
    try:
        before = [_outcome(requests, config) for requests, config in runs]
        SchedulerModel._schedule_waiting = mutated
        after = [_outcome(requests, config) for requests, config in runs]
    finally:
        Admission.admit, SchedulerModel._schedule_waiting = original_admit, original_method
    assert before == after and joins > 0
    preempted = sum(metrics["preemptions"] for metrics, *_ in before)
    assert preempted > 0, "no preemption: no request joined again"
    print(f"    {joins // 2} joins ({preempted} after a preemption), none with placeholders; "
          f"{len(runs)} replays: the same records")
