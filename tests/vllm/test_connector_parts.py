"""Where a replay finds a connector's parts (kvoffload/vllm/connector_parts.py), on stand-in objects
shaped as the reference, vLLM's OffloadingConnector and a connector that says nothing (no vLLM
needed): the copy call a stepped handler waits for, and the requests still tracked at the end,
from which a run's leaked_requests is counted."""

from __future__ import annotations

from types import SimpleNamespace

from kvoffload.vllm.connector_parts import copy_hook, tracked_requests


def test_the_copy_call_is_the_workers_own_or_its_inner_workers_or_nothing():
    copied = []
    own = SimpleNamespace(copy_submitted=lambda: copied.append("own"))
    inner = SimpleNamespace(connector_worker=SimpleNamespace(worker=SimpleNamespace(
        copy_submitted=lambda: copied.append("inner"))))
    copy_hook(own)()
    copy_hook(inner)()
    copy_hook(SimpleNamespace())()  # a worker that copies on its own: nothing to call
    assert copied == ["own", "inner"]


def test_tracked_requests_come_from_the_reference_core_or_the_stock_scheduler_or_nobody():
    reference = SimpleNamespace(core=SimpleNamespace(tracked_request_ids=lambda: ["a", "b"]))
    stock = SimpleNamespace(connector_scheduler=SimpleNamespace(_req_status={"c": object()}))
    assert tracked_requests(reference) == ("a", "b")
    assert tracked_requests(stock) == ("c",)
    assert tracked_requests(SimpleNamespace()) is None  # says nothing: leaks are not counted for it
