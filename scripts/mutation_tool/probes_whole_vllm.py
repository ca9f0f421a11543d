"""Probes for the equivalent mutants of ``vllm/`` in the run over the rest of the package
(``fates_whole.py``): each shows that no input the guarded code can see tells the mutant from the
original. They import vLLM, so they run in its venv, as CI's vLLM stage does:

    PYTHONHASHSEED=0 PYTHONPATH=reference .venv-vllm/bin/python scripts/mutation_tool/probes_whole_vllm.py
"""

from __future__ import annotations


def _mutated_module(module, old: str, new: str) -> dict:
    """``module``'s source with ``old`` made ``new`` (once), executed as a module of its own: the
    namespace of the mutant."""
    import inspect

    source = inspect.getsource(module)
    assert source.count(old) == 1, old
    namespace = {"__name__": module.__name__ + "_mutant"}
    exec(compile(source.replace(old, new), "mutant", "exec"), namespace)  # noqa: S102
    return namespace


def the_stand_in_queue_never_reads_block() -> None:
    """vllm/standins/threads.py InlineQueue.put: the default ``block: bool = True`` made ``False``.
    ``put`` (and ``put_nowait``, the same function) never reads ``block``: it appends and lets the
    consumer drain, as a SimpleQueue's put never blocks. Checked on the bytecode (no load of
    ``block``) and on a consumer fed by the shipped and the mutated class alike, with ``block``
    given and defaulted."""
    import dis

    from kvoffload.vllm.standins import threads

    loads = {ins.argval for ins in dis.get_instructions(threads.InlineQueue.put) if ins.opname.startswith("LOAD_")}
    assert "block" not in loads and "item" in loads
    assert threads.InlineQueue.put_nowait is threads.InlineQueue.put
    mutant = _mutated_module(threads, "def put(self, item: Any, block: bool = True,",
                             "def put(self, item: Any, block: bool = False,")
    seen = []
    for queue_class, thread_class in ((threads.InlineQueue, threads.InlineThread),
                                      (mutant["InlineQueue"], mutant["InlineThread"])):
        got = []

        def loop(queue, got=got):
            while True:
                item = queue.get()
                if item is None:
                    return
                got.append(item)

        queue = queue_class()
        thread = thread_class(target=loop, args=(queue,))
        thread.start()
        queue.put(1)
        queue.put(2, block=True)
        queue.put(3, False)
        queue.put_nowait(4)
        alive = thread.is_alive()
        queue.put(None)
        seen.append((got, alive, thread.is_alive(), queue.empty()))
    assert seen[0] == seen[1] == ([1, 2, 3, 4], True, False, True), seen


def no_family_is_changed_or_hashed() -> None:
    """vllm/foreign.py: ``@dataclass(frozen=True)`` of ``Family`` made ``frozen=False``. The two
    classes differ only in assignment and deletion of a field (refused when frozen) and in
    ``__hash__`` (none when not frozen, since ``eq`` stays on). No code of the package assigns or
    deletes an attribute of a family, calls ``setattr``/``delattr`` or ``hash`` (a set or a dict
    key of families would hash them): the sources are checked (every attribute store's object
    and every ``family``-named value), and every family, looked up by name and by class path,
    builds its connector config, refusals, stand-ins and storage need with ``__hash__`` made to
    raise."""
    import ast
    from pathlib import Path

    import kvoffload
    from kvoffload.engine.config import EngineConfig
    from kvoffload.vllm import foreign

    root = Path(kvoffload.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("setattr", "delattr") or "family" not in ast.unparse(node).lower(), \
                    (path, ast.unparse(node))
                if node.func.id == "hash":
                    assert "family" not in ast.unparse(node).lower(), (path, ast.unparse(node))
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                        assert "family" not in ast.unparse(sub.value).lower(), (path, ast.unparse(sub))
            if isinstance(node, (ast.Set, ast.SetComp, ast.Dict, ast.DictComp)):
                keys = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, ast.Set) else \
                    [node.key] if isinstance(node, ast.DictComp) else [node.elt]
                for key in keys:
                    if key is not None:
                        assert "family" not in ast.unparse(key).lower() or isinstance(key, ast.Constant) or \
                            ".name" in ast.unparse(key), (path, ast.unparse(key))

    from kvoffload.vllm.build import ConnectorLoad

    def refuse(self):
        raise AssertionError("a Family was hashed")

    hash_before = foreign.Family.__hash__
    foreign.Family.__hash__ = refuse
    try:
        engine = EngineConfig()
        for name, family in foreign.FAMILIES.items():
            for source in (name, family.class_path):
                assert foreign.family_of(source) is not None
                load = ConnectorLoad(source)
                load.transfer_config(engine, "stepped")
                assert load.refused is not None and (load.standins is None) == (family.standins is None)
                load.needs_storage  # noqa: B018 - read for its family lookups
        composed = ConnectorLoad("stock+example")
        composed.transfer_config(engine, "stepped")
        composed.refused, composed.standins, composed.needs_storage  # noqa: B018
    finally:
        foreign.Family.__hash__ = hash_before


def the_preempted_tables_are_never_read_again() -> None:
    """vllm/model.py BlockTables.update: ``for req_id in preempted_req_ids or ()`` (drop its
    tables) made ``... and ()`` (keep them). A preempted request's tables are read only when it is
    scheduled again (the fake worker and ScheduledWrites read ``num_scheduled_tokens``' requests),
    and vLLM schedules it again only as a new request or a resumed one, whose tables ``update``
    sets afresh: the kept tables are overwritten before any read. Checked on vLLM's scheduler:
    every preempted request scheduled again arrives new or resumed, and the replays with the
    shipped and the mutated ``update`` (spec-decode-small on 24 GPU blocks, sync and async, with
    preemptions) give the same record."""
    from dataclasses import asdict

    from kvoffload.vllm import model
    from kvoffload.vllm.build import REFERENCE, ConnectorLoad
    from kvoffload.vllm.replay import VllmSchedulerReplay
    from kvoffload.workloads import load_workload

    shipped_update = model.BlockTables.update
    mutant = _mutated_module(model, "preempted_req_ids or ()", "preempted_req_ids and ()")["BlockTables"]

    def watched(self, scheduler_output):
        preempted = self.__dict__.setdefault("probe_preempted", set())
        cached = scheduler_output.scheduled_cached_reqs
        again = (set(cached.req_ids) - set(cached.resumed_req_ids)) & preempted
        assert not again, f"scheduled again without being resumed: {again}"
        preempted -= {new.req_id for new in scheduler_output.scheduled_new_reqs} | set(cached.resumed_req_ids)
        preempted |= set(scheduler_output.preempted_req_ids or ())
        return watched.update(self, scheduler_output)

    records = {}
    try:
        for label, update in (("shipped", shipped_update), ("mutant", mutant.update)):
            watched.update = update
            model.BlockTables.update = watched
            for scheduling in ("sync", "async"):
                workload = load_workload("spec-decode-small", {"gpu_blocks": "24", "scheduling": scheduling})
                record = VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(REFERENCE)).run()
                fields = asdict(record)
                for timing in ("wall_seconds", "connector_seconds", "store_seconds", "load_seconds"):
                    fields.pop(timing, None)
                records[label, scheduling] = fields
    finally:
        model.BlockTables.update = shipped_update
    for scheduling in ("sync", "async"):
        shipped = records["shipped", scheduling]
        assert shipped["preemptions"] > 0 and shipped["crash"] is None and not shipped["poisoned"]
        assert shipped == records["mutant", scheduling], scheduling


def errno_is_never_read_after_the_prctl() -> None:
    """vllm/pinned.py _die_with_parent: ``ctypes.CDLL(None, use_errno=True)`` made ``False``.
    ``use_errno`` only makes ctypes keep a private copy of errno for ``ctypes.get_errno``; the
    module never reads errno (nor the prctl's return value). Checked: no ``get_errno``/``errno``
    read in the module's source, and libc's prctl through both handles answers alike (the
    PR_GET_PDEATHSIG query, which changes nothing)."""
    import ctypes
    import inspect

    from kvoffload.vllm import pinned

    source = inspect.getsource(pinned)
    assert "get_errno" not in source and "set_errno" not in source and "import errno" not in source
    assert source.count("use_errno=True") == 1
    function = inspect.getsource(pinned._die_with_parent)
    assert "= libc.prctl" not in function and "if libc.prctl" not in function  # its return value is dropped
    answers = []
    for use_errno in (True, False):
        signal_number = ctypes.c_int(-1)
        libc = ctypes.CDLL(None, use_errno=use_errno)
        answers.append((libc.prctl(2, ctypes.byref(signal_number), 0, 0, 0), signal_number.value))  # PR_GET_PDEATHSIG
    assert answers[0] == answers[1], answers


def drafts_for_the_others_change_nothing() -> None:
    """vllm/replay.py _update: ``spec_tokens and req_id in samples and not async`` made
    ``spec_tokens and req_id in samples or not async``. Sync, the mutant also hands drafts to
    requests in a partial prefill chunk (vLLM's ``update_draft_token_ids`` skips them, their
    drafts already empty) and, without speculative decoding, empty proposals (an empty list over
    an empty list); async, it replaces the scheduler's ``k`` placeholders with ``k`` fillers: the
    same count, and only counts of scheduled drafts are read (vLLM's ``update_from_output``, the
    fake worker, ScheduledWrites). Checked: replays with the shipped and the mutated ``_update``
    (no drafts, drafts sync and async, drafts with preemptions) give the same record, metric for
    metric; the stand-in's readers take only ``len`` of the scheduled drafts."""
    import ast
    import inspect
    from dataclasses import asdict

    from kvoffload.vllm import fake_worker, replay, scheduled_writes
    from kvoffload.vllm.build import REFERENCE, ConnectorLoad
    from kvoffload.workloads import load_workload

    for module in (fake_worker, scheduled_writes):  # every name bound to the drafts is read as len(name.get(...))
        tree = ast.parse(inspect.getsource(module))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        bound = 0
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            names = {target.id for node in ast.walk(function) if isinstance(node, ast.Assign)
                     and "scheduled_spec_decode_tokens" in ast.unparse(node.value) for target in node.targets}
            bound += len(names)
            for node in ast.walk(function):
                if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
                    get = parents[node]
                    call = parents[get]
                    outer = parents[call]
                    assert isinstance(get, ast.Attribute) and get.attr == "get" and isinstance(call, ast.Call), \
                        ast.unparse(parents[node])
                    assert isinstance(outer, ast.Call) and ast.unparse(outer.func) == "len", ast.unparse(outer)
            for node in ast.walk(function):  # and nothing else reads the scheduled drafts
                if isinstance(node, ast.Attribute) and node.attr == "scheduled_spec_decode_tokens":
                    assert isinstance(parents[node], (ast.Assign, ast.BoolOp)), ast.unparse(parents[node])
        assert bound >= 1, module.__name__
    shipped_update = replay.VllmSchedulerReplay._update
    mutant_update = _mutated_module(
        replay, "elif self.engine.spec_tokens and req_id in samples and not self.config",
        "elif self.engine.spec_tokens and req_id in samples or not self.config")["VllmSchedulerReplay"]._update
    cases = [("shared-prefix-small", {"scheduling": "sync"}), ("spec-decode-small", {"scheduling": "sync"}),
             ("spec-decode-small", {"scheduling": "async"}),
             ("spec-decode-small", {"scheduling": "async", "gpu_blocks": "24"})]
    records = {}
    try:
        for label, update in (("shipped", shipped_update), ("mutant", mutant_update)):
            replay.VllmSchedulerReplay._update = update
            for name, settings in cases:
                workload = load_workload(name, settings)
                record = replay.VllmSchedulerReplay(workload.requests, workload.engine, ConnectorLoad(REFERENCE)).run()
                fields = asdict(record)
                for timing in ("wall_seconds", "connector_seconds", "store_seconds", "load_seconds"):
                    fields.pop(timing, None)
                records[label, name, tuple(settings.items())] = fields
    finally:
        replay.VllmSchedulerReplay._update = shipped_update
    for name, settings in cases:
        key = (name, tuple(settings.items()))
        shipped = records[("shipped", *key)]
        assert shipped["crash"] is None and shipped["finished_requests"] > 0, key
        assert shipped == records[("mutant", *key)], key


PROBES_WHOLE_VLLM = [the_stand_in_queue_never_reads_block, no_family_is_changed_or_hashed,
                     the_preempted_tables_are_never_read_again, errno_is_never_read_after_the_prctl,
                     drafts_for_the_others_change_nothing]

if __name__ == "__main__":
    for probe in PROBES_WHOLE_VLLM:
        probe()
        print(f"ok  {probe.__name__}")
