"""Foreign failures are verdicts: whatever a connector does wrong, ``run`` ends with exit 1 and a
result file that says what (or flags it), never a raw traceback or a quiet exit 0.

Each class of failure has a small planted connector (``foreign_connectors.py``, loaded by module
path as a user names one): an exception of a type no engine used to count, a connector that
cannot start, an ``OSError`` (not bad input: exit 1, not 2), a connector that serves nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

HERE = Path(__file__).parent


@pytest.fixture
def run_cli(monkeypatch, tmp_path, capsys):
    from kvoffload.cli import main

    monkeypatch.syspath_prepend(str(HERE))

    def run(connector: str, *options: str, workload: str = "multi-turn-small"):
        out = tmp_path / "result.json"
        code = main(["run", "--engine", "vllm-scheduler", "--connector", connector, "--workload", workload,
                     "--quiet", "--out", str(out), *options])
        captured = capsys.readouterr()
        return code, (json.loads(out.read_text()) if out.exists() else None), captured.out, captured.err
    return run


def test_an_exception_of_any_type_is_a_crash_with_the_connectors_frames(run_cli):
    code, result, table, err = run_cli("foreign_connectors:AttributeErrorConnector")
    assert code == 1
    error = result["error"]
    assert result["metrics"]["crashes"] == 1 and error["type"] == "AttributeError" and error["step"] > 0
    assert error["message"] == "AttributeError: planted: 'NoneType' object has no attribute 'slot_mapping'"
    # The connector's own frame, innermost: not the replay's, not vLLM's scheduler's.
    assert "foreign_connectors.py" in error["connector_frames"][-1]
    assert "in build_connector_meta" in error["connector_frames"][-1]
    assert "raise AttributeError" in error["traceback"]
    assert f"crash at step {error['step']}: AttributeError" in table  # under the table, with the frame
    assert err.strip().splitlines()[-1].startswith("kvoffload: run failed at step")


def test_a_connector_that_cannot_start_is_one_verdict(run_cli):
    code, result, table, err = run_cli("foreign_connectors:StartFailsConnector")
    assert code == 1
    assert result["error"]["could_not_start"] and result["error"]["step"] is None
    assert result["error"]["message"] == "could not start: RuntimeError: planted: No supported cpu connector found"
    assert result["metrics"]["crashes"] == 1
    assert err.strip().splitlines() == ["kvoffload: run failed before its first step: could not start: "
                                        "RuntimeError: planted: No supported cpu connector found"]


def test_an_oserror_from_the_connector_is_its_crash_not_bad_input(run_cli):
    code, result, _, err = run_cli("foreign_connectors:MissingFileConnector")
    assert code == 1  # 2 would say the command line was wrong
    assert result["error"]["type"] == "FileNotFoundError"
    assert "No such file or directory" in result["error"]["message"]


def test_a_connector_that_serves_nothing_is_flagged(run_cli):
    """The reference serves 2,560 tokens of multi-turn-small on the simulator; this one none."""
    code, result, table, _ = run_cli("broken_connector:NeverServesConnector")
    assert code == 0 and result["metrics"]["crashes"] == 0
    assert result["served_nothing"]["reference_hit_tokens"] > 0
    assert "served nothing: the connector served no token; the reference serves" in table
    strict, _, _, err = run_cli("broken_connector:NeverServesConnector", "--strict")
    assert strict == 1 and "--strict: served nothing" in err


def test_a_connector_that_never_returns_is_stopped_and_named(run_cli):
    """A lookup that blocks forever: the run stops at the step bound (1 s here), exit 1, and the
    verdict names the call and the request."""
    import time

    import kvoffload.vllm.replay  # noqa: F401 - vLLM's import is not the connector's time

    started = time.monotonic()
    code, result, _, err = run_cli("foreign_connectors:HangsConnector", "--step-timeout", "1")
    assert code == 1 and time.monotonic() - started < 60
    assert result["error"]["type"] == "ConnectorTimeout"
    message = result["error"]["message"]
    assert "did not finish within 1 s: in get_num_new_matched_tokens for request " in message
    assert any("foreign_connectors.py" in frame and "threading.Event().wait()" in frame
               for frame in result["error"]["connector_frames"])


def test_a_connector_known_to_need_a_gpu_is_one_line_on_a_cpu(run_cli):
    """LMCache 0.5.6 on a CPU (its worker needs CUDA ops) degraded to recompute and served
    nothing, silently; a connector named so is refused before it starts (checked by name)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine LMCache runs")
    code, result, _, err = run_cli("foreign_connectors:FakeLMCacheConnector")
    assert code == 1 and result["error"]["could_not_start"]
    assert err.strip().splitlines()[-1].endswith("LMCache has no CPU KV path for vLLM (its worker needs CUDA ops); "
                                                 "on a CPU it degrades to recompute and serves nothing")


def test_a_release_row_of_a_connector_that_never_returns_is_stopped_and_named(monkeypatch, capsys):
    """``releases`` replays in each release's venv (``python -m kvoffload.vllm.rows``, what
    ``releases --step-timeout`` calls): the bound stops the hang there too, and the row names it."""
    import json
    import time

    from kvoffload.vllm import rows

    monkeypatch.syspath_prepend(str(HERE))
    started = time.monotonic()
    assert rows.main(["--connector", "foreign_connectors:HangsConnector", "--step-timeout", "1",
                      "multi-turn-small:sync"]) == 0
    assert time.monotonic() - started < 60
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert "did not finish within 1 s: in get_num_new_matched_tokens for request " in row["error"]["message"]
    assert row["metrics"]["crashes"] == 1
