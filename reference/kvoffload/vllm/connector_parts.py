"""Where each connector keeps the parts a replay reads: the transfer handler that copies (ours,
or vLLM's OffloadingConnector over the torch-copy spec) or the stand-ins' copy timeline (a
foreign connector's, ``standins/``), its "copy what was submitted" call, and the requests the
scheduler half still tracks. Both vLLM replays (``replay``, ``llm_engine``) and the gate stories
use them. A composed connector (vLLM's ``MultiConnector``) is read through its parts."""

from __future__ import annotations


def parts_of(connector) -> list:
    """A MultiConnector's sub-connectors, in order; any other connector alone."""
    parts = getattr(connector, "_connectors", None)
    return list(parts) if isinstance(parts, list) and type(connector).__name__ == "MultiConnector" else [connector]


def standin_timeline(worker):
    """The copy timeline of a worker whose GPU calls run on the CPU stand-ins, else None."""
    return getattr(worker, "kvoffload_timeline", None)


def copy_hook(worker):
    """The worker's 'copy what was submitted' call (stepped handlers, the stand-ins' timeline),
    or a no-op."""
    hooks = []
    timeline = standin_timeline(worker)
    if timeline is not None:
        hooks.append(timeline.after_forward)
    for part in parts_of(worker):
        hook = getattr(part, "copy_submitted", None)
        if hook is None:
            inner = getattr(getattr(part, "connector_worker", None), "worker", None)
            hook = getattr(inner, "copy_submitted", None)
        if hook is not None:
            hooks.append(hook)

    def copy_all() -> None:
        for hook in hooks:
            hook()
    return copy_all


def wait_for_unreported_copies(worker) -> bool:
    """Copies submitted and not yet reported: wait until they are copied, so the next step
    reports them (True), else False. With a background handler a step can find nothing to do
    while a load or the last request's final store is still copying; a run waits for the copy
    instead of counting the step as idle (200 such steps pass in milliseconds, a copy may take
    longer) or ending with the request still tracked. vLLM's engine would keep stepping, in real
    time, until the copy lands; here the verdict never depends on a copy thread's timing."""
    timeline = standin_timeline(worker)
    waited = timeline.finish_all() if timeline is not None else False
    for part in parts_of(worker):
        handler = _handler_of(part)
        if handler is not None and getattr(handler, "unreported_jobs", 0):
            handler.wait_all()
            waited = True
    return waited


def block_copy_backend(worker):
    """SimpleCPU's copy backend (``worker_handler._backend``: stores and loads of single blocks),
    else None."""
    for part in parts_of(worker):
        backend = getattr(getattr(part, "worker_handler", None), "_backend", None)
        if hasattr(backend, "launch_copy"):
            return backend
    return None


def transfer_handler(worker):
    """The project's transfer handler a part of the worker copies through (the first), else None."""
    return next((h for h in map(_handler_of, parts_of(worker)) if h is not None), None)


def _handler_of(worker):
    handler = getattr(getattr(worker, "worker", None), "handler", None)  # KVOffloadConnector
    if handler is None:  # vLLM's OffloadingConnector with the torch-copy spec
        handler = getattr(getattr(getattr(worker, "connector_worker", None), "worker", None), "handler", None)
    return handler if hasattr(handler, "totals") else None


def tracked_requests(connector) -> tuple[str, ...] | None:
    """Requests the connector (any of its parts) still tracks; None when none says."""
    said = [ids for ids in map(_tracked_by, parts_of(connector)) if ids is not None]
    return tuple(sorted(set().union(*said))) if said else None


def _tracked_by(connector) -> tuple[str, ...] | None:
    core = getattr(connector, "core", None)
    if core is not None:
        return tuple(core.tracked_request_ids())
    stock = getattr(connector, "connector_scheduler", None)
    if stock is not None and hasattr(stock, "_req_status"):
        return tuple(stock._req_status)  # vLLM's OffloadingConnectorScheduler keeps them here
    simple = getattr(connector, "scheduler_manager", None)
    if simple is not None and hasattr(simple, "_reqs_to_load"):
        # vLLM's SimpleCPUOffloadScheduler: loads, eager stores, pins awaiting their allocation
        tracked = {*simple._reqs_to_load, *getattr(simple, "_reqs_to_store", ()), *simple._pending_cpu_hits}
        return tuple(sorted(tracked))
    return None
