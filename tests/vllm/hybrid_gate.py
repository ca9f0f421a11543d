"""One packaged hybrid gate (``kvoffload.gates.test_k14_k19_hybrid``) run from a test, with what it
replayed kept: the gate asserts and returns nothing, and the tests read its record."""

from __future__ import annotations

from kvoffload.gates.plugin import GateConnector


def run_kept(gate_name: str, story: str, source: str, monkeypatch):
    """Gate class ``gate_name``'s test ``story`` against connector ``source``: the (record, built)
    of its replay. (The gate module is imported here, not in the test file, where pytest would
    collect its classes as the file's own tests.)"""
    from kvoffload.gates import test_k14_k19_hybrid as gates

    kept = []
    plain = gates.replay

    def keeping(*args, **kwargs):
        kept.append(plain(*args, **kwargs))
        return kept[-1]
    monkeypatch.setattr(gates, "replay", keeping)
    getattr(getattr(gates, gate_name)(), story)(GateConnector(source, None))
    return kept[0]
