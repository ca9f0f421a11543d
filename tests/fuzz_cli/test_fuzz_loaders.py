"""Fuzzed workload input through the command line, in-process: Mooncake traces, ShareGPT files
and TOML definitions (``kvoffload workloads show``, which reads, validates and generates)."""

from __future__ import annotations

from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

from fuzz_inputs import definition, fuzz_settings, mooncake_trace, sharegpt_file, toml_text
from hypothesis import given

from kvoffload.cli import main

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
    (tmp_path / "trace.jsonl").write_text(trace)
    code, _, err = run_in_process(["workloads", "show", f"mooncake:{tmp_path / 'trace.jsonl'}"])
    assert_clean_exit(code, err)


@fuzz_settings(12)
@given(content=sharegpt_file())
def test_fuzzed_sharegpt_files(content, tmp_path):
    (tmp_path / "chat.json").write_bytes(content)
    code, _, err = run_in_process(["workloads", "show", f"sharegpt:{tmp_path / 'chat.json'}"])
    assert_clean_exit(code, err)


@fuzz_settings(120)
@given(fuzzed=definition(), trace=mooncake_trace())
def test_fuzzed_definitions(fuzzed, trace, tmp_path):
    (tmp_path / "trace.jsonl").write_text(trace if fuzzed["generator"]["kind"] != "mooncake" or len(trace) % 2
                                          else SAMPLE_TRACE)
    (tmp_path / "chat.json").write_text('[{"conversations": [{"from": "human", "value": "hi"}, '
                                        '{"from": "gpt", "value": "hello there"}]}]')
    (tmp_path / "w.toml").write_text(toml_text(fuzzed))
    code, _, err = run_in_process(["workloads", "show", str(tmp_path / "w.toml")])
    assert_clean_exit(code, err)
