"""Replay metrics per bundled workload x connector configuration, and workload generation time.

One class per workload. Its ``setup_cache`` replays the workload once through every connector
configuration (the reference with all fixes, then the vLLM presets) and returns the metrics;
every ``track_`` method only reads that dict (scipy's ``BenchGlobal`` pattern: one replay,
many tracked numbers).

asv reads every number as lower-is-better, so each metric is tracked in its lower-is-better form:
a miss rate instead of a hit rate (``1 - last_block_hit_rate``), seconds per output token instead
of tokens per second, simulator seconds per request instead of requests per second. Counts that
must stay zero (poisoned loads, lifecycle violations, leaks, crashes) are tracked as they are.
A metric without a value (no eligible continuation: a workload that offloads prompts only has
no last-block population) is recorded as NaN, which asv shows as n/a.

Deterministic: every count, rate and delay (the same commit gives the same value on any
machine; gate them with a factor near 1). Measured: ``connector_us_per_step`` and
``sim_seconds_per_request`` (noisy; compare them on one machine only).
"""

from __future__ import annotations

import math
from pathlib import Path

# The preset list is pure Python (no torch). The rest of kvoffload is imported inside the
# functions that replay: asv starts a fresh process for every benchmark and parameter, and a
# track_ process only reads the cached metrics (no torch import).
from kvoffload.core.fixes import PRESETS

# The suite reads workload definitions from this checkout: asv may run the package from a wheel,
# which does not carry the repository's workloads/ folder.
WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"

CONNECTORS = ["reference", *PRESETS]  # the reference, then every vLLM preset (core/fixes.py)

# The store delays changed meaning in df49c27 (drafts no longer count as written KV; async
# visibility is timed when the engine processes the completion): version 2. benchmarks/record
# records them only for commits that descend from df49c27, so one line never mixes definitions.
STORE_DELAY_VERSION = "2"


def workload_spec(name: str) -> str:
    """A bundled workload NAME as the path of its definition in this checkout."""
    path = WORKLOADS_DIR / f"{name}.toml"
    return str(path) if path.is_file() else name


def connector_choice(label: str):
    from kvoffload.runner import ConnectorChoice

    return ConnectorChoice.build(None if label == "reference" else label)


def _complement(rate: float | None) -> float | None:
    return None if rate is None else 1.0 - rate


def _inverse(rate: float | None) -> float | None:
    return None if not rate else 1.0 / rate


def tracked_metrics(metrics: dict) -> dict[str, float | None]:
    """A run's metrics (glossary names) in the lower-is-better forms the suite tracks."""
    tracked = {
        "last_block_miss_rate": _complement(metrics.get("last_block_hit_rate")),
        "offload_miss_rate": _complement(metrics.get("offload_hit_rate")),
        "gpu_miss_rate": _complement(metrics.get("gpu_hit_rate")),
        "seconds_per_output_token_modeled": _inverse(metrics.get("tokens_per_s_modeled")),
        "sim_seconds_per_request": _inverse(metrics.get("sim_requests_per_s")),
    }
    for name in ("poisoned_loads", "lifecycle_violations", "leaked_requests", "stuck_requests", "crashes",
                 "fence_violations", "store_submit_delay_steps_p50", "store_submit_delay_steps_p99",
                 "store_visible_delay_steps_p50", "store_visible_delay_steps_p99", "connector_us_per_step"):
        tracked[name] = metrics.get(name)  # absent in an older commit's results: n/a
    return tracked


def replay_connectors(workload_name: str, connectors: list[str]) -> dict[str, dict[str, float | None]]:
    """Replay one workload through each connector configuration: {connector: tracked metrics}."""
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(workload_spec(workload_name))
    return {label: tracked_metrics(replay_workload(workload, connector_choice(label)).result["metrics"])
            for label in connectors}


def _value(cache: dict, connector: str, name: str) -> float:
    value = cache[connector][name]
    return math.nan if value is None else float(value)  # NaN: asv records n/a


class _ReplayTracks:
    """The tracked metrics of one workload; subclasses name the workload and own ``setup_cache``.

    Each subclass defines its own ``setup_cache``: asv keys the cache by the function's source
    line, so an inherited one would be shared by every workload.
    """

    workload = ""
    params = [CONNECTORS]
    param_names = ["connector"]
    timeout = 600  # setup_cache replays the workload len(CONNECTORS) times
    version = "1"  # bump when a tracked number changes meaning; edits elsewhere keep history

    def track_last_block_miss_rate(self, cache, connector):
        """Eligible continuations whose parent's last fully-written chunk the connector missed."""
        return _value(cache, connector, "last_block_miss_rate")

    track_last_block_miss_rate.unit = "ratio"

    def track_offload_miss_rate(self, cache, connector):
        """1 - offload_hit_rate: per admission, tokens the connector supplied / tokens asked."""
        return _value(cache, connector, "offload_miss_rate")

    track_offload_miss_rate.unit = "ratio"
    track_offload_miss_rate.version = "2"  # per admission since issue 15 (was: every lookup, repeats too)

    def track_gpu_miss_rate(self, cache, connector):
        return _value(cache, connector, "gpu_miss_rate")

    track_gpu_miss_rate.unit = "ratio"

    def track_poisoned_loads(self, cache, connector):
        """Loaded chunks that fail the KV content oracle (0 for the reference)."""
        return _value(cache, connector, "poisoned_loads")

    track_poisoned_loads.unit = "chunks"

    def track_lifecycle_violations(self, cache, connector):
        return _value(cache, connector, "lifecycle_violations")

    track_lifecycle_violations.unit = "calls"

    def track_leaked_requests(self, cache, connector):
        return _value(cache, connector, "leaked_requests")

    track_leaked_requests.unit = "requests"

    def track_stuck_requests(self, cache, connector):
        return _value(cache, connector, "stuck_requests")

    track_stuck_requests.unit = "requests"

    def track_crashes(self, cache, connector):
        return _value(cache, connector, "crashes")

    track_crashes.unit = "crashes"

    def track_fence_violations(self, cache, connector):
        return _value(cache, connector, "fence_violations")

    track_fence_violations.unit = "blocks"

    def track_store_submit_delay_p50(self, cache, connector):
        """Steps from a chunk's KV fully written to its store's submission, median."""
        return _value(cache, connector, "store_submit_delay_steps_p50")

    track_store_submit_delay_p50.unit = "steps"
    track_store_submit_delay_p50.version = STORE_DELAY_VERSION

    def track_store_submit_delay_p99(self, cache, connector):
        return _value(cache, connector, "store_submit_delay_steps_p99")

    track_store_submit_delay_p99.unit = "steps"
    track_store_submit_delay_p99.version = STORE_DELAY_VERSION

    def track_store_visible_delay_p50(self, cache, connector):
        """Steps from a chunk's KV fully written to complete_store (loadable), median."""
        return _value(cache, connector, "store_visible_delay_steps_p50")

    track_store_visible_delay_p50.unit = "steps"
    track_store_visible_delay_p50.version = STORE_DELAY_VERSION

    def track_store_visible_delay_p99(self, cache, connector):
        return _value(cache, connector, "store_visible_delay_steps_p99")

    track_store_visible_delay_p99.unit = "steps"
    track_store_visible_delay_p99.version = STORE_DELAY_VERSION

    def track_seconds_per_output_token_modeled(self, cache, connector):
        """1 / tokens_per_s_modeled (cost model, hardware profile of the workload)."""
        return _value(cache, connector, "seconds_per_output_token_modeled")

    track_seconds_per_output_token_modeled.unit = "s/token (modeled)"

    def track_connector_us_per_step(self, cache, connector):
        """Wall time in connector calls per step, both sides (measured)."""
        return _value(cache, connector, "connector_us_per_step")

    track_connector_us_per_step.unit = "µs/step"

    def track_sim_seconds_per_request(self, cache, connector):
        """Simulator wall time per replayed request, 1 / sim_requests_per_s (measured)."""
        return _value(cache, connector, "sim_seconds_per_request")

    track_sim_seconds_per_request.unit = "s/request"


class TrackSharedPrefix(_ReplayTracks):
    workload = "shared-prefix"

    def setup_cache(self):
        return replay_connectors(self.workload, CONNECTORS)


class TrackMultiTurn(_ReplayTracks):
    workload = "multi-turn"

    def setup_cache(self):
        return replay_connectors(self.workload, CONNECTORS)


class TrackSpecDecode(_ReplayTracks):
    workload = "spec-decode"

    def setup_cache(self):
        return replay_connectors(self.workload, CONNECTORS)


class GenerateWorkload:
    """Turning a definition into its request stream: parse, override, generate, order."""

    params = [["shared-prefix", "multi-turn", "spec-decode"]]
    param_names = ["workload"]
    timeout = 120

    def setup(self, name):
        from kvoffload.workloads import load_workload

        self.load_workload = load_workload

    def time_generate(self, name):
        self.generated = self.load_workload(workload_spec(name))

    def peakmem_generate(self, name):
        self.generated = self.load_workload(workload_spec(name))
