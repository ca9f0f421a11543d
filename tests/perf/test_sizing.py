"""Sizing the tiers from the workload: early rejection, gpu_blocks=auto, cpu_chunks in bytes or %.

A user's trace that cannot fit the GPU pool is rejected before its tokens are built, with the
minimum that fits; ``auto`` grows the pool to that minimum; the CPU tier can be named in bytes
of host memory or as a share of what the workload would ever store.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.engine.cost import profile
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import WorkloadError, load_workload
from kvoffload.workloads.mooncake import MooncakeTrace
from kvoffload.workloads.sizing import distinct_chunks


def write_trace(path: Path, lengths: list[tuple[int, int]]) -> Path:
    """One request per (input, output) length, 10 ms apart; every prompt starts with block 0."""
    lines = []
    for i, (inp, out) in enumerate(lengths):
        blocks = -(-inp // 512)
        ids = [0] + [1000 * (i + 1) + b for b in range(blocks - 1)]
        lines.append(json.dumps({"timestamp": 10 * i, "input_length": inp, "output_length": out, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_that_cannot_fit_is_rejected_before_its_tokens_are_built(tmp_path, monkeypatch):
    trace = write_trace(tmp_path / "t.jsonl", [(600, 10), (5000, 120), (900, 5)])

    def must_not_run(self, ctx):
        raise AssertionError("the trace was generated before the fit check")

    monkeypatch.setattr(MooncakeTrace, "generate", must_not_run)
    monkeypatch.setattr(MooncakeTrace, "stream", must_not_run)
    with pytest.raises(WorkloadError) as error:
        load_workload(f"mooncake:{trace}", {"gpu_blocks": "100"})
    # 5120 tokens in 16-token blocks = 320 blocks + the null block; 99 blocks hold 1584 tokens
    assert str(error.value) == (
        f"{trace}: line 2: expected prompt + output within max_model_len 1,584 ((gpu_blocks - 1) x "
        "block_size - spec_tokens), got 5,000 + 120 tokens; it needs gpu_blocks >= 321 (--set gpu_blocks=auto "
        "sizes the pool)")


def test_gpu_blocks_auto_grows_the_pool_to_the_minimum_that_fits_and_the_replay_finishes(tmp_path):
    """The trace default pool is 6144 blocks; a 100,000-token prompt needs 6264 (with its answer)."""
    trace = write_trace(tmp_path / "t.jsonl", [(600, 10), (100_000, 200), (900, 5)])
    with pytest.raises(WorkloadError, match="it needs gpu_blocks >= 6,264 "):
        load_workload(f"mooncake:{trace}")
    workload = load_workload(f"mooncake:{trace}", {"gpu_blocks": "auto", "max_num_seqs": "4"})
    assert workload.engine.gpu_blocks == 6264
    outcome = replay_workload(workload, ConnectorChoice.build())
    assert not outcome.failed
    assert outcome.result["metrics"]["leaked_requests"] == 0


def test_gpu_blocks_auto_keeps_a_configured_pool_that_already_fits():
    configured = load_workload("multi-turn-small")
    assert load_workload("multi-turn-small", {"gpu_blocks": "auto"}).engine == configured.engine


def test_a_synthetic_workload_is_rejected_while_generated_and_auto_sizes_it_afterwards(tmp_path):
    """Generators without a cheap longest_request: the length bound applies as they generate, and
    gpu_blocks=auto lifts it until the requests exist to size the pool."""
    bundled = Path(__file__).resolve().parents[2] / "workloads" / "multi-turn-small.toml"
    text = bundled.read_text()
    tiny = tmp_path / "tiny-pool.toml"
    tiny.write_text(re.sub(r"(?m)^gpu_blocks = \d+", "gpu_blocks = 8", text))
    with pytest.raises(WorkloadError, match=r"request c0-t01: expected prompt \+ output within max_model_len"):
        load_workload(str(tiny))
    workload = load_workload(str(tiny), {"gpu_blocks": "auto"})
    longest = max(spec.num_prompt_tokens + spec.max_tokens for spec in workload.requests)
    assert workload.engine.gpu_blocks == -(-longest // workload.engine.block_size) + 1 > 8


# the largest units at a size this machine holds: 2**-10 TiB is 1 GiB, 0.0015 TB is 1.5 GB
@pytest.mark.parametrize("size, num_bytes", [("1GiB", 2**30), ("3.5 GB", 3_500_000_000), ("64MiB", 2**26),
                                             ("0.0009765625 TiB", 2**30), ("0.0015 TB", 1_500_000_000),
                                             ("1500000 kB", 1_500_000_000), ("1572864KiB", 1_610_612_736)])
def test_cpu_chunks_in_bytes_hold_that_much_kv_at_the_profiles_width(size, num_bytes):
    workload = load_workload("multi-turn-small", {"cpu_chunks": size})
    engine = workload.engine
    chunk_bytes = engine.tokens_per_chunk * profile(engine.profile).kv_bytes_per_token
    assert engine.cpu_chunks == num_bytes // chunk_bytes
    assert engine.cpu_chunks * chunk_bytes <= num_bytes < (engine.cpu_chunks + 1) * chunk_bytes


def _distinct_chunks_by_prefix(workload) -> int:
    """The model: a chunk is its whole token prefix, so equal prefixes are one chunk."""
    size = workload.engine.tokens_per_chunk
    prefixes = set()
    for spec in workload.requests:
        tokens = spec.prompt_token_ids + spec.output_token_ids
        prefixes.update(tuple(tokens[: end]) for end in range(size, len(tokens) + 1, size))
    return len(prefixes)


@pytest.mark.parametrize("share", ["100%", "50%", "12.5%"])
def test_cpu_chunks_as_a_share_of_the_workloads_distinct_chunks(share):
    workload = load_workload("multi-turn-small", {"cpu_chunks": share})
    distinct = _distinct_chunks_by_prefix(workload)
    assert distinct_chunks(workload.requests, workload.engine) == distinct
    assert workload.engine.cpu_chunks == math.ceil(float(share.rstrip("%")) / 100 * distinct)


@pytest.mark.parametrize("text, problem", [
    ("lots", "expected a chunk count (8192), a size (64GiB, 500MB) or a share of the workload's distinct "
             "chunks (50%), got 'lots'"),
    ("0%", "expected a share in (0%, 100%], got 0%"),
    ("150%", "expected a share in (0%, 100%], got 150%"),
])
def test_a_bad_tier_size_is_one_line_naming_the_forms(text, problem):
    with pytest.raises(WorkloadError) as error:
        load_workload("multi-turn-small", {"cpu_chunks": text})
    assert str(error.value) == f"--set cpu_chunks={text}: {problem}"


def test_a_size_smaller_than_one_chunk_is_rejected_naming_what_a_chunk_holds():
    """The line says what a chunk is: its tokens times the profile's KV bytes per token."""
    engine = load_workload("multi-turn-small").engine
    per_token = profile(engine.profile).kv_bytes_per_token
    chunk = engine.tokens_per_chunk * per_token
    with pytest.raises(WorkloadError) as error:
        load_workload("multi-turn-small", {"cpu_chunks": "1000B"})
    assert str(error.value) == (f"--set cpu_chunks: 1000 bytes hold no chunk of {chunk} bytes ({engine.tokens_per_chunk} "
                                f"tokens x {per_token} bytes of KV per token, profile {engine.profile})")


def test_the_command_line_rejects_an_oversized_trace_in_one_line_with_exit_2(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", [(5000, 120)])
    run = subprocess.run([sys.executable, "-m", "kvoffload.cli", "run", "--workload", f"mooncake:{trace}",
                          "--set", "gpu_blocks=64", "--quiet", "--out", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "it needs gpu_blocks >= 321" in run.stderr
    assert not (tmp_path / "r.json").exists()


def test_equal_chunks_after_different_prefixes_are_different_chunks():
    """Chunks are keyed by their whole prefix (chained), as the connector's hashes are."""
    from kvoffload.engine.requests import RequestSpec

    engine = load_workload("multi-turn-small").engine.replace(block_size=2, blocks_per_chunk=1)
    a = RequestSpec("a", prompt_token_ids=(20, 21, 30, 31), output_token_ids=(40,))
    b = RequestSpec("b", prompt_token_ids=(22, 23, 30, 31), output_token_ids=(40,))
    c = RequestSpec("c", prompt_token_ids=(20, 21, 30, 31, 40), output_token_ids=(41,))
    # a: [20 21] [20 21|30 31]; b: [22 23] [22 23|30 31]; c repeats a's two and adds [..|40 41]
    assert distinct_chunks([a, b, c], engine) == 5
    assert distinct_chunks([a, b, c], engine.replace(offload_prompt_only=True)) == 4


def test_a_trace_is_generated_with_the_auto_sized_pool_already_in_place(tmp_path, monkeypatch):
    """Generation sees the final pool (a generator may bound lengths by it while it builds)."""
    trace = write_trace(tmp_path / "t.jsonl", [(100_000, 200)])
    seen = []
    stream = MooncakeTrace.stream  # a trace's requests are streamed, built as the replay reaches them

    def spy(self, ctx):
        seen.append(ctx.engine.gpu_blocks)
        return stream(self, ctx)

    monkeypatch.setattr(MooncakeTrace, "stream", spy)
    load_workload(f"mooncake:{trace}", {"gpu_blocks": "auto"})
    assert seen == [6264]


def test_gpu_blocks_auto_grows_a_pool_to_at_most_2_26_token_slots_and_refuses_more_before_any_token(
        tmp_path, monkeypatch):
    """Issue 22: a request of exactly 2**26 tokens was sized a pool of 2**26 + 16 slots and the run
    grew past 5 GiB. ``limits.MAX_TOKENS`` bounds the pool auto builds, null block included: the
    longest request that fits such a pool is sized it, one token more is refused in one line,
    both before any of the trace's tokens is built."""
    from kvoffload.workloads.limits import MAX_TOKENS

    pools = []

    class Sized(Exception):
        """The sizing is done; building 2**26 tokens is not this story's."""

    def stop_before_building(self, ctx):
        pools.append(ctx.engine.gpu_blocks)
        raise Sized

    monkeypatch.setattr(MooncakeTrace, "stream", stop_before_building)
    monkeypatch.setattr(MooncakeTrace, "generate", stop_before_building)
    # 16-token blocks: 2**22 blocks hold 2**26 slots, the null block's 16 are not the request's
    fits = MAX_TOKENS - 16
    with pytest.raises(Sized):
        load_workload(f"mooncake:{write_trace(tmp_path / 'fits.jsonl', [(fits - 1, 1)])}", {"gpu_blocks": "auto"})
    assert pools == [2**22]
    exactly = write_trace(tmp_path / "exactly.jsonl", [(600, 10), (MAX_TOKENS - 1, 1)])
    with pytest.raises(WorkloadError) as error:
        load_workload(f"mooncake:{exactly}", {"gpu_blocks": "auto"})
    assert str(error.value) == (
        f"{exactly}: line 2: expected prompt + output of at most 67,108,848 tokens (a gpu_blocks=auto pool holds "
        "at most 2**26 token slots, the null block and one step's drafts included), got 67,108,863 + 1 tokens")
    assert pools == [2**22]


def test_a_generated_workload_sized_by_auto_is_bounded_by_the_same_pool_while_it_generates(tmp_path):
    """Without a cheap longest request (a TOML definition), each request is checked against the
    largest pool auto may size before its tokens are generated: 2**26 tokens of answer alone are
    refused, naming that pool's max_model_len."""
    bundled = Path(__file__).resolve().parents[2] / "workloads" / "multi-turn-small.toml"
    long_answer = tmp_path / "long-answer.toml"
    long_answer.write_text(re.sub(r"(?m)^answer_len = .*$", "answer_len = 67108864", bundled.read_text()))
    with pytest.raises(WorkloadError, match=r"request c0-t00: expected prompt \+ output within max_model_len "
                                            r"67,108,848 \(\(gpu_blocks - 1\) x block_size - spec_tokens\), got "
                                            r"[\d,]+ \+ 67,108,864 tokens$"):
        load_workload(str(long_answer), {"gpu_blocks": "auto"})
