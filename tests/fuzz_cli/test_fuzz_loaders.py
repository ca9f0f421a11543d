"""Fuzzed workload input through the command line, in-process: Mooncake traces, ShareGPT files
and TOML definitions (``kvoffload workloads show``, which reads, validates and generates), with
integers past 4,300 digits among their numbers (issue 22); and traces sized with
``--set gpu_blocks=auto``, whose pool must stay within what a request of ``limits.MAX_TOKENS``
needs (issue 22: it grew with any request)."""

from __future__ import annotations

from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from fuzz_inputs import INPUTS, definition, fuzz_settings, mooncake_trace, sharegpt_file, toml_text
from hypothesis import given

import kvoffload.cli.run
from kvoffload.cli import main
from kvoffload.workloads.limits import MAX_TOKENS
from kvoffload.workloads.sizing import min_gpu_blocks

SAMPLE_TRACE = (Path(__file__).resolve().parents[2] / "workloads" / "samples" / "mooncake-sample.jsonl").read_text()


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    """``kvoffload ARGV`` in this process; any exception escaping it fails the test (a traceback)."""
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_clean_exit(code: int, err: str, allowed=(0, 2)) -> None:
    assert code in allowed, err
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("kvoffload: error: "), err
    elif code == 0:
        assert err == ""


@fuzz_settings(60)
@given(trace=mooncake_trace())
def test_fuzzed_mooncake_traces(trace, tmp_path):
    INPUTS["Mooncake traces"] += 1
    (tmp_path / "trace.jsonl").write_text(trace)
    code, _, err = run_in_process(["workloads", "show", f"mooncake:{tmp_path / 'trace.jsonl'}"])
    assert_clean_exit(code, err)


@fuzz_settings(12)
@given(content=sharegpt_file())
def test_fuzzed_sharegpt_files(content, tmp_path):
    INPUTS["ShareGPT files"] += 1
    (tmp_path / "chat.json").write_bytes(content)
    code, _, err = run_in_process(["workloads", "show", f"sharegpt:{tmp_path / 'chat.json'}"])
    assert_clean_exit(code, err)


@fuzz_settings(120)
@given(fuzzed=definition(), trace=mooncake_trace())
def test_fuzzed_definitions(fuzzed, trace, tmp_path):
    INPUTS["TOML definitions"] += 1
    (tmp_path / "trace.jsonl").write_text(trace if fuzzed["generator"]["kind"] != "mooncake" or len(trace) % 2
                                          else SAMPLE_TRACE)
    (tmp_path / "chat.json").write_text('[{"conversations": [{"from": "human", "value": "hi"}, '
                                        '{"from": "gpt", "value": "hello there"}]}]')
    (tmp_path / "w.toml").write_text(toml_text(fuzzed))
    code, _, err = run_in_process(["workloads", "show", str(tmp_path / "w.toml")])
    assert_clean_exit(code, err)


class Sized(Exception):
    """The replay was reached: the workload passed validation (``args[0]``)."""


def _sized(workload, *args, **kwargs):
    raise Sized(workload)


@pytest.fixture
def no_replay(monkeypatch):
    monkeypatch.setattr(kvoffload.cli.run, "replay", _sized)


@fuzz_settings(30)
@given(trace=mooncake_trace())
def test_fuzzed_traces_sized_by_gpu_blocks_auto(trace, tmp_path_factory, no_replay):
    INPUTS["auto-sized traces"] += 1
    folder = tmp_path_factory.mktemp("auto")
    (folder / "trace.jsonl").write_text(trace)
    try:
        code, _, err = run_in_process(["run", "--quiet", "--workload", f"mooncake:{folder / 'trace.jsonl'}", "--set",
                                       "gpu_blocks=auto", "--out", str(folder / "r.json")])
    except Sized as sized:
        engine = sized.args[0].engine
        assert engine.gpu_blocks <= max(6144, min_gpu_blocks(MAX_TOKENS, engine))  # 6144: the default pool
        return
    assert_clean_exit(code, err, allowed=(2,))
