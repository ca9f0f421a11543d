"""Where each connector keeps the parts a replay reads: the transfer handler that copies (ours,
or vLLM's OffloadingConnector over the torch-copy spec) or the stand-ins' copy timeline (a
foreign connector's, ``standins/``), its "copy what was submitted" call, and the requests the
scheduler half still tracks. Both vLLM replays (``replay``, ``llm_engine``) and the gate stories
use them."""

from __future__ import annotations


def standin_timeline(worker):
    """The copy timeline of a worker whose GPU calls run on the CPU stand-ins, else None."""
    return getattr(worker, "kvoffload_timeline", None)


def copy_hook(worker):
    """The worker's 'copy what was submitted' call (stepped handlers, the stand-ins' timeline),
    or a no-op."""
    timeline = standin_timeline(worker)
    if timeline is not None:
        return timeline.after_forward
    hook = getattr(worker, "copy_submitted", None)
    if hook is None:
        inner = getattr(getattr(worker, "connector_worker", None), "worker", None)
        hook = getattr(inner, "copy_submitted", None)
    return hook or (lambda: None)


def wait_for_unreported_copies(worker) -> bool:
    """Copies submitted and not yet reported: wait until they are copied, so the next step
    reports them (True), else False. With a background handler a step can find nothing to do
    while a load or the last request's final store is still copying; a run waits for the copy
    instead of counting the step as idle (200 such steps pass in milliseconds, a copy may take
    longer) or ending with the request still tracked. vLLM's engine would keep stepping, in real
    time, until the copy lands; here the verdict never depends on a copy thread's timing."""
    timeline = standin_timeline(worker)
    if timeline is not None:
        return timeline.finish_all()
    handler = transfer_handler(worker)
    if handler is None or not getattr(handler, "unreported_jobs", 0):
        return False
    handler.wait_all()
    return True


def block_copy_backend(worker):
    """SimpleCPU's copy backend (``worker_handler._backend``: stores and loads of single blocks),
    else None."""
    backend = getattr(getattr(worker, "worker_handler", None), "_backend", None)
    return backend if hasattr(backend, "launch_copy") else None


def transfer_handler(worker):
    handler = getattr(getattr(worker, "worker", None), "handler", None)  # KVOffloadConnector
    if handler is None:  # vLLM's OffloadingConnector with the torch-copy spec
        handler = getattr(getattr(getattr(worker, "connector_worker", None), "worker", None), "handler", None)
    return handler if hasattr(handler, "totals") else None


def tracked_requests(connector) -> tuple[str, ...] | None:
    """Requests the connector still tracks; None when it does not say."""
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
