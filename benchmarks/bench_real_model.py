"""Measured throughput and latency of a real model in vLLM's engine (``--engine vllm``).

One replay per connector (``off``: no connector, no prefix caching; vLLM's ``stock``
OffloadingConnector; the ``reference``) of ``shared-prefix-small`` on the tiny Llama with seeded
weights, in ``setup_cache``. Each track reads the cached metrics; every number is lower-is-better
as asv reads it: seconds per output token (1 / ``output_tokens_per_s``), TTFT and TPOT in ms.
``time_replay`` times a whole replay again per sample (``gpu-runner`` records several).

Needs vLLM in the environment asv runs (the ``vllm`` extra). Without it ``setup`` raises
NotImplementedError and asv records the benchmarks as skipped (n/a), which is what the CPU
machine's virtualenv history shows; ``benchmarks/README.md`` says how to record them with the
vLLM environment.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"
WORKLOAD = "shared-prefix-small"
CONNECTORS = ["off", "stock", "reference"]


def has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


# A GPU runner's own model (scripts/gpu-runner --model DIR sets it for asv): RealModelGiven tracks
# it beside the tiny model's line, the model's folder name as a parameter, so the two never join.
GIVEN_MODEL = os.environ.get("KVOFFLOAD_ASV_MODEL", "")


def replay(connector: str, model: str | None = None) -> dict:
    from kvoffload.choice import ConnectorChoice
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    path = WORKLOADS_DIR / f"{WORKLOAD}.toml"
    workload = load_workload(str(path) if path.is_file() else WORKLOAD)
    outcome = replay_workload(workload, ConnectorChoice.build(source=connector), engine="vllm",
                              engine_options={"oracle": False, "model": model})
    if outcome.failed:
        raise RuntimeError(f"{WORKLOAD} on --engine vllm, connector {connector}: {outcome.result['error']}")
    return outcome.result["metrics"]


class RealModel:
    params = [CONNECTORS]
    param_names = ["connector"]
    timeout = 1800
    version = "1"

    def setup_cache(self):
        if not has_vllm():
            return None
        return {connector: replay(connector) for connector in CONNECTORS}

    def setup(self, cache, connector):
        if cache is None:
            raise NotImplementedError("needs vLLM (the vllm extra)")
        self.metrics = cache[connector]

    def track_seconds_per_output_token(self, cache, connector):
        rate = self.metrics.get("output_tokens_per_s")
        return 1.0 / rate if rate else float("nan")

    track_seconds_per_output_token.unit = "s/token (measured)"

    def track_ttft_ms_p50(self, cache, connector):
        return self.metrics.get("ttft_ms_p50")

    track_ttft_ms_p50.unit = "ms (measured)"

    def track_ttft_ms_p99(self, cache, connector):
        return self.metrics.get("ttft_ms_p99")

    track_ttft_ms_p99.unit = "ms (measured)"

    def track_tpot_ms_p50(self, cache, connector):
        return self.metrics.get("tpot_ms_p50")

    track_tpot_ms_p50.unit = "ms (measured)"


class RealModelGiven(RealModel):
    """RealModel's tracks on the model of ``$KVOFFLOAD_ASV_MODEL`` (skipped, n/a, without one)."""

    params = [[Path(GIVEN_MODEL).name or "none"], CONNECTORS]
    param_names = ["model", "connector"]

    def setup_cache(self):
        if not has_vllm() or not GIVEN_MODEL:
            return None
        return {connector: replay(connector, GIVEN_MODEL) for connector in CONNECTORS}

    def setup(self, cache, model, connector):
        if cache is None:
            raise NotImplementedError("needs vLLM and a model ($KVOFFLOAD_ASV_MODEL, scripts/gpu-runner --model)")
        self.metrics = cache[connector]

    def track_seconds_per_output_token(self, cache, model, connector):
        return RealModel.track_seconds_per_output_token(self, cache, connector)

    track_seconds_per_output_token.unit = "s/token (measured)"

    def track_ttft_ms_p50(self, cache, model, connector):
        return self.metrics.get("ttft_ms_p50")

    track_ttft_ms_p50.unit = "ms (measured)"

    def track_ttft_ms_p99(self, cache, model, connector):
        return self.metrics.get("ttft_ms_p99")

    track_ttft_ms_p99.unit = "ms (measured)"

    def track_tpot_ms_p50(self, cache, model, connector):
        return self.metrics.get("tpot_ms_p50")

    track_tpot_ms_p50.unit = "ms (measured)"


class RealModelReplay:
    """Wall time of one whole replay (engine start-up included), reference connector."""

    timeout = 1800
    version = "1"
    number = 1
    repeat = (1, 3, 600.0)
    rounds = 1
    warmup_time = 0

    def setup(self):
        if not has_vllm():
            raise NotImplementedError("needs vLLM (the vllm extra)")

    def time_replay(self):
        replay("reference")
