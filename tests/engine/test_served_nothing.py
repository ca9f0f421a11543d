"""A connector that failed quietly (``runner.served_nothing``): it supplied no token where the
reference, on the simulator, supplies some. A connector that served tokens, or crashed, did not
fail quietly, whichever engine ran it; a run of no connector never did."""

from __future__ import annotations

import dataclasses

from kvoffload.choice import ConnectorChoice
from kvoffload.engine.engine import Engine
from kvoffload.runner import served_nothing
from kvoffload.workloads import load_workload

SCHEDULER = "vllm-scheduler"  # a run outside the simulator: the reference's row is not a given there


def test_only_a_connector_that_neither_served_nor_crashed_served_nothing():
    workload = load_workload("multi-turn-small")
    record = Engine(workload.requests, workload.engine, ConnectorChoice.build().fixes).run()
    assert record.connector_hit_tokens_admitted > 0 and record.crash is None
    for choice in (ConnectorChoice.build(), ConnectorChoice.build(source="stock")):
        assert served_nothing(workload, choice, SCHEDULER, record) is None  # it served
        crashed = dataclasses.replace(record, connector_hit_tokens_admitted=0, crash="KeyError: 'r3'")
        assert served_nothing(workload, choice, SCHEDULER, crashed) is None  # a crash is said as one
    quiet = dataclasses.replace(record, connector_hit_tokens_admitted=0)
    assert served_nothing(workload, ConnectorChoice.build(source="stock"), SCHEDULER, quiet) == {
        "reference_hit_tokens": record.connector_hit_tokens_admitted,
        "message": f"the connector served no token; the reference serves {record.connector_hit_tokens_admitted:,} "
                   "tokens of this workload (simulator, all fixes)"}
    assert served_nothing(workload, ConnectorChoice.build(source="off"), SCHEDULER, quiet) is None
