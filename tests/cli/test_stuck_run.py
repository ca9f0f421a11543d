"""A run that ends with requests stuck is a failed run, like a crash or a livelock (issue 22)."""

from __future__ import annotations

import json

from kvoffload.cli import main

STUCK_SETTINGS = ("gpu_blocks=8", "block_size=2", "blocks_per_chunk=1", "spec_tokens=2",
                  "max_num_batched_tokens=2", "max_num_seqs=1")


def test_a_request_left_stuck_exits_1_and_records_why(capsys, tmp_path):
    """Two equal Mooncake lines: the second is served by the connector and left with one token,
    whose padded decode step (1 + 2 drafts) never fits the 2-token budget (docs/engine.md,
    "Speculative decoding"). It used to end with stuck_requests 1 and exit 0."""
    trace = tmp_path / "twice.jsonl"
    trace.write_text('{"timestamp":0,"input_length":2,"output_length":1,"hash_ids":[7]}\n' * 2)
    out = tmp_path / "stuck.json"
    argv = ["run", "--workload", f"mooncake:{trace}", "--quiet", "--out", str(out)]
    for setting in STUCK_SETTINGS:
        argv += ["--set", setting]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1
    result = json.loads(out.read_text())
    assert result["metrics"]["stuck_requests"] == 1 and result["metrics"]["livelock"] == 0
    assert result["error"]["message"].startswith("1 request stuck (mc-2): nothing was scheduled for 200 steps")
    assert result["error"]["step"] == result["metrics"]["steps"]
    assert err.strip().splitlines()[-1].startswith("kvoffload: run failed at step")
