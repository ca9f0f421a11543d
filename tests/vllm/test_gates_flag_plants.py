"""Each fix flag's vLLM gates fail with that flag off, in CI. The rows come from the plant table of
tests/gates/README.md, which ``scripts/gates_table --matrix`` generates from a run of every gate
against the reference with one flag disabled (``--kv-disable FLAG``); that run is on demand
(minutes per release). Here each listed gate is replayed again in vLLM 0.32's scheduler against
the reference with its flag off, and must fail: a story whose numbers drift until it no longer
shows its flag's bug is a gate that no longer catches it, and the packaged gates (run against
connectors that pass) cannot see that. The plants that are connectors, not flags, are proven by
test_gates_planted.py."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import runpy
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.core.fixes import Fixes  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402

# the script that generates the plant table owns how it is read and which modules hold the gates
GATES_TABLE = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts" / "gates_table"), run_name="gates_table")


def flag_plants() -> list[tuple[str, str]]:
    """(fix flag, ``Class::test``) for every gate the README's generated plant table says fails
    with that flag off, as ``scripts/gates_table`` reads it back; the connector plants' rows (no
    flag) are left to test_gates_planted.py."""
    plants = GATES_TABLE["previous_plants"]()
    flags = {field.name for field in dataclasses.fields(Fixes)}
    return [(flag, gate) for flag, gates in plants.items() if flag in flags for gate in gates]


def gate_cases(name: str):
    """The gate ``Class::test`` of the packaged modules, as one callable per case of its
    parametrize marks (each taking the connector)."""
    class_name, test_name = name.split("::")
    for module_name in GATES_TABLE["GATE_MODULES"]:
        module = importlib.import_module(f"kvoffload.gates.{module_name}")
        cls = getattr(module, class_name, None)
        if cls is not None:
            break
    else:
        raise LookupError(f"no packaged gate class {class_name}")
    test = getattr(cls(), test_name)
    marks = [mark for mark in getattr(test, "pytestmark", []) + getattr(cls, "pytestmark", [])
             if mark.name == "parametrize"]
    axes = []
    for mark in marks:
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else list(mark.args[0])
        values = [value if len(names) > 1 else (value,) for value in mark.args[1]]
        axes.append([dict(zip(names, getattr(v, "values", v))) for v in values])
    for combination in itertools.product(*axes):
        arguments = {key: value for part in combination for key, value in part.items()}
        yield arguments, (lambda connector, arguments=arguments: test(connector, **arguments))


PLANTS = flag_plants()


def test_the_table_names_a_gate_for_each_flag_it_plants():
    # the table's parsing is part of the proof: an empty list would make the test below vacuous
    assert len(PLANTS) >= 8
    assert {"last_block_at_finish", "final_token_watermark", "deferred_finish_signal"} <= {f for f, _ in PLANTS}


@pytest.mark.parametrize("flag, gate", PLANTS, ids=[f"{flag}-{gate.split('::')[0]}" for flag, gate in PLANTS])
def test_the_gate_fails_against_the_reference_with_its_flag_off(flag, gate):
    failed = []
    for arguments, run in gate_cases(gate):
        try:
            run(GateConnector("reference", None, (flag,)))
        except Exception as error:  # an assertion or a crash of the engine: the gate failed
            failed.append((arguments, type(error).__name__))
    assert failed, f"{gate} passes against the reference with {flag} off: it no longer catches its bug"
