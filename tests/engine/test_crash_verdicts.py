"""Any exception the connector raises is the run's crash verdict, in the simulator as in the vLLM
engines (``kvoffload.engine.crashes``): its type, a one-line message (a bare assert names its
line), the connector's own frames and the traceback; and a replay run in a child interpreter
(``kvoffload.vllm.pinned``) keeps the original traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvoffload.core.scheduler import ReferenceConnectorScheduler
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.engine import Engine
from kvoffload.engine.requests import RequestSpec

ROOT = Path(__file__).resolve().parents[2]


def one_request() -> list[RequestSpec]:
    return [RequestSpec("A", tuple(range(3, 35)), (7, 8, 9))]


def test_an_exception_of_an_unlisted_type_is_a_crash_with_the_connectors_frame(monkeypatch):
    def broken(self, *args, **kwargs):
        raise TypeError("planted: unsupported operand")

    monkeypatch.setattr(ReferenceConnectorScheduler, "build_connector_meta", broken)
    record = Engine(one_request(), EngineConfig(gpu_blocks=64, block_size=4)).run()
    assert (record.crash, record.crash_type, record.crash_step) == ("TypeError: planted: unsupported operand",
                                                                     "TypeError", 0)
    assert record.crash_frames[-1].endswith('in broken: raise TypeError("planted: unsupported operand")')
    assert "test_crash_verdicts.py" in record.crash_frames[-1]
    assert record.problems() == [f"crash at step 0: TypeError: planted: unsupported operand [{record.crash_frames[-1]}]"]


PLANTED = """
def bare_assert(self, *args, **kwargs):
    assert args == ()


def fails(*, on_step=None):
    raise LookupError("planted in the child")
"""


def planted_module(tmp_path, monkeypatch):
    """A module outside the test files (pytest rewrites their asserts; a connector's are plain)."""
    (tmp_path / "planted_connector.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    import planted_connector

    return planted_connector


def test_a_bare_assert_names_its_line(monkeypatch, tmp_path):
    planted = planted_module(tmp_path, monkeypatch)
    monkeypatch.setattr(ReferenceConnectorScheduler, "build_connector_meta", planted.bare_assert)
    record = Engine(one_request(), EngineConfig(gpu_blocks=64, block_size=4)).run()
    assert record.crash == "AssertionError: assert args == () (planted_connector.py:3)"


CHILD = """
from kvoffload.vllm.pinned import call_pinned
from planted_connector import fails

try:
    call_pinned(fails)
except LookupError as error:
    print("NOTES:", "\\n".join(getattr(error, "__notes__", [])))
"""


def test_the_pinned_child_keeps_the_original_traceback(tmp_path, monkeypatch):
    """In a process that hashes strings otherwise, the call runs in a child interpreter; its
    exception comes back with the child's traceback as a note."""
    planted_module(tmp_path, monkeypatch)
    env = dict(os.environ, PYTHONHASHSEED="1", PYTHONPATH=os.pathsep.join([str(ROOT / "reference"), str(tmp_path)]))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert "NOTES: raised in the replay's child interpreter:" in done.stdout, done.stdout + done.stderr
    assert 'raise LookupError("planted in the child")' in done.stdout
