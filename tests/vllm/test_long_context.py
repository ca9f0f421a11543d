"""``--engine vllm-scheduler`` sizes the model's context to the workload: a request longer than
the tiny model's 65,536 positions (the Mooncake slice's longest prompt is 121,237 tokens)
replays through vLLM's scheduler as it does in the simulator, instead of vLLM's ModelConfig
refusing it with a 40-line pydantic error. What vLLM's config classes still refuse is refused in
one line, exit 2, before any replay."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.choice import ConnectorChoice  # noqa: E402
from kvoffload.cli import main  # noqa: E402
from kvoffload.engines import SIMULATOR, VLLM_SCHEDULER  # noqa: E402
from kvoffload.metrics import MEASURED_METRICS  # noqa: E402
from kvoffload.runner import replay_workload  # noqa: E402
from kvoffload.vllm.build import TINY_CONTEXT  # noqa: E402
from kvoffload.workloads import load_workload  # noqa: E402

SLICE = "mooncake:workloads/samples/mooncake/conversation-first200.jsonl"


def deterministic(metrics: dict) -> dict:
    return {name: value for name, value in metrics.items() if name not in MEASURED_METRICS and value is not None}


def both_engines(spec: str, overrides: dict) -> tuple[dict, dict]:
    workload = load_workload(spec, overrides)
    sim = replay_workload(workload, ConnectorChoice.build(), engine=SIMULATOR).result["metrics"]
    real = replay_workload(workload, ConnectorChoice.build(), engine=VLLM_SCHEDULER).result["metrics"]
    return deterministic(sim), deterministic(real)


def test_a_request_longer_than_the_tiny_models_context_replays_as_in_the_simulator(tmp_path):
    """Two Mooncake-style requests of 66,048 tokens, the second sharing 100 of the first's 129
    blocks of 512 tokens: past TINY_CONTEXT, so vLLM is given a model whose context fits."""
    first = {"timestamp": 0, "input_length": 66_048, "output_length": 4, "hash_ids": list(range(129))}
    second = {"timestamp": 4_000, "input_length": 66_048, "output_length": 4,
              "hash_ids": list(range(100)) + list(range(1_000, 1_029))}
    trace = tmp_path / "long.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in (first, second)))
    assert first["input_length"] > TINY_CONTEXT
    sim, real = both_engines(f"mooncake:{trace}", {"gpu_blocks": "auto", "cpu_chunks": "4096"})
    common = sim.keys() & real.keys()
    assert {name: real[name] for name in common} == {name: sim[name] for name in common}
    assert real["requests"] == 2 and real["crashes"] == 0 and real["stuck_requests"] == 0
    assert real["gpu_hit_rate"] > 0.35  # the second request found the 51,200 shared tokens


def test_a_setting_vllm_refuses_is_one_line_and_exit_2(capsys, tmp_path):
    """max_num_seqs above max_num_batched_tokens passes the simulator's checks; vLLM's
    SchedulerConfig refuses it. One line naming the class and vLLM's reason; nothing written."""
    out = tmp_path / "r.json"
    code = main(["run", "--engine", "vllm-scheduler", "--workload", "multi-turn-small", "--set", "max_num_seqs=2048",
                 "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert [line for line in err if line.startswith("kvoffload: error:")] == [
        "kvoffload: error: vLLM's SchedulerConfig refuses this replay's settings: max_num_batched_tokens (256) "
        "must be greater than or equal to max_num_seqs (2048)."]
    assert not any("Traceback" in line or "validation error" in line for line in err)
    assert not out.exists()


@pytest.mark.vllm_on_demand  # the whole slice: minutes on 2 cores; scripts/vllm-on-demand
def test_the_shipped_mooncake_slice_replays_through_vllms_scheduler_as_in_the_simulator():
    sim, real = both_engines(SLICE, {"gpu_blocks": "auto"})
    common = sim.keys() & real.keys()
    assert {name: real[name] for name in common} == {name: sim[name] for name in common}
    assert real["requests"] == 200 and real["steps"] == sim["steps"]
