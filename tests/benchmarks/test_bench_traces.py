"""The trace-slice benchmark: a real trace, committed with its licence, that the suite can load."""

from __future__ import annotations

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "workloads" / "samples" / "mooncake"


def test_the_committed_slice_carries_its_licence_and_notice():
    assert sum(1 for _ in (SAMPLES / "conversation-first200.jsonl").open()) == 200
    assert "Apache License" in (SAMPLES / "LICENSE-APACHE").read_text()[:400]
    notice = (SAMPLES / "NOTICE.md").read_text()
    assert "kvcache-ai/Mooncake" in notice and "Apache License, Version 2.0" in notice


def test_the_benchmark_loads_the_slice_with_a_pool_sized_to_it(suite, methods_of):
    module = suite("bench_traces")
    bench = module.MooncakeConversationSlice()
    assert methods_of(module.MooncakeConversationSlice) == [
        "peakmem_replay", "time_replay", "track_first_admission_reuse_gap"]
    for scheduling in bench.params:
        bench.setup(scheduling)
        workload = bench.workload
        assert len(workload.requests) == 200 and workload.engine.scheduling == scheduling
        longest = max(spec.num_prompt_tokens + spec.max_tokens for spec in workload.requests)
        assert (workload.engine.gpu_blocks - 1) * workload.engine.block_size >= longest
