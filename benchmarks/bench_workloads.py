"""Replay metrics per bundled workload x connector configuration, and workload generation time.

Two kinds of number, two kinds of class, one replay process (``replay_suite``, the
``setup_cache`` every replay class shares):

- ``Track<Workload>``: the deterministic metrics (counts, rates, delays, the modelled s/token) of
  one replay of the full workload per connector configuration (the reference with all fixes, then
  the vLLM presets). The same commit gives the same value on every replay and every machine, so
  one evaluation is the whole truth (``tests/benchmarks/test_bench_workloads.py`` replays twice
  and compares).
- ``Measure<Workload>``: the measured metrics (``connector_us_per_step``,
  ``sim_seconds_per_request``) of ``MEASURE_REPEAT`` replays of the workload's ``-small``
  definition per connector, interleaved round by round, returned as samples: asv keeps their
  median, quartiles and 99 % interval, and the history chart draws the spread.

Every ``track_`` method only reads the cache (scipy's ``BenchGlobal`` pattern: one replay
process, many tracked numbers). The methods are made from one table, ``TRACKS`` (glossary metric,
track name, lower-is-better form, unit, version, measured or not); ``NOT_TRACKED`` gives the
reason for every glossary metric without a track.

asv reads every number as lower-is-better, so each metric is tracked in its lower-is-better form:
a miss rate instead of a hit rate (``1 - last_block_hit_rate``), seconds per output token instead
of tokens per second, simulator seconds per request instead of requests per second. Counts that
must stay zero (poisoned loads, lifecycle violations, leaks, crashes) are tracked as they are.
A metric without a value (no eligible continuation: a workload that offloads prompts only has
no last-block population) is recorded as NaN, which asv shows as n/a.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

# The preset list is pure Python (no torch). The rest of kvoffload is imported inside the
# functions that replay: asv runs every benchmark and parameter in its own process, and a
# track_ process only reads the cached metrics (no torch import).
from kvoffload.core.fixes import PRESETS

from .samples import asv_samples

# The suite reads workload definitions from this checkout: asv may run the package from a wheel,
# which does not carry the repository's workloads/ folder.
WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"

CONNECTORS = ["reference", *PRESETS]  # the reference, then every vLLM preset (core/fixes.py)
# The tracked workloads, in full: kvoffload.workloads.bundled's list, written out (benchmarks/record
# runs this suite against commits whose package has no such module; a test keeps the two equal).
# The hybrid ones (gpt-oss: full attention + a sliding window; qwen3-next: full attention + Mamba)
# replay their dense twins' requests.
WORKLOADS = ("shared-prefix", "multi-turn", "spec-decode", "gpt-oss-multi-turn", "gpt-oss-spec-decode",
             "qwen3-next-multi-turn", "qwen3-next-spec-decode")
# Replays per connector of each -small workload for the measured tracks: five samples give
# quartiles; the 75 replays of the -small workloads cost a fraction of the 15 full ones
# (benchmarks/README.md, "History").
MEASURE_REPEAT = 5

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


class Track(NamedTuple):
    """One asv track of one glossary metric (``kvoffload.metrics.GLOSSARY``), lower is better.

    ``name`` (without ``track_``) and ``version`` are asv's history key: never rename a track, and
    bump its version (with a row in ``benchmarks/record``'s ``since``) when its number changes meaning.
    """

    metric: str  # the glossary name
    name: str  # the track: bench_workloads.Track<Workload>.track_<name>
    form: str  # how the metric becomes lower-is-better: "as is", "1 - x" (a hit rate), "1 / x" (a rate)
    unit: str
    doc: str = ""
    version: str = "1"
    measured: bool = False  # a wall-time measurement: repeated samples (Measure*), else one replay (Track*)


# Every glossary metric is tracked here or listed in NOT_TRACKED with its reason; the tests hold the
# two against the glossary (tests/benchmarks/test_bench_workloads.py). The suite does not import
# the glossary itself: benchmarks/record runs this suite against old commits, whose packages may
# lack metrics this checkout has (their tracks are then n/a, not an import error).
TRACKS: tuple[Track, ...] = (
    Track("last_block_hit_rate", "last_block_miss_rate", "1 - x", "ratio",
          "Eligible continuations whose parent's last fully-written chunk the connector missed."),
    Track("last_chunk_offloaded_rate", "last_chunk_lost_rate", "1 - x", "ratio",
          "Finished requests whose last fully-written chunk never reached the offload tier, as a share."),
    # per admission since issue 15 (was: every lookup, repeats too)
    Track("offload_hit_rate", "offload_miss_rate", "1 - x", "ratio",
          "1 - offload_hit_rate: per admission, tokens the connector supplied / tokens asked.", version="2"),
    Track("gpu_hit_rate", "gpu_miss_rate", "1 - x", "ratio", "1 - GPU prefix-cache hit tokens / prompt tokens."),
    Track("repeated_lookups", "repeated_lookups", "as is", "lookups",
          "Connector lookups that answered but did not end in an admission."),
    Track("poisoned_loads", "poisoned_loads", "as is", "chunks",
          "Loaded chunks that fail the KV content oracle (0 for the reference)."),
    Track("lifecycle_violations", "lifecycle_violations", "as is", "calls"),
    Track("leaked_requests", "leaked_requests", "as is", "requests"),
    Track("stuck_requests", "stuck_requests", "as is", "requests"),
    Track("crashes", "crashes", "as is", "crashes"),
    Track("livelock", "livelock", "as is", "runs", "1 if the progress watchdog stopped the run."),
    Track("invariant_violations", "invariant_violations", "as is", "checks",
          "Failed invariant checks of the block pool and the connector."),
    Track("fence_violations", "fence_violations", "as is", "blocks"),
    Track("store_submit_delay_steps_p50", "store_submit_delay_p50", "as is", "steps",
          "Steps from a chunk's KV fully written to its store's submission, median.", STORE_DELAY_VERSION),
    Track("store_submit_delay_steps_p99", "store_submit_delay_p99", "as is", "steps", "", STORE_DELAY_VERSION),
    Track("store_visible_delay_steps_p50", "store_visible_delay_p50", "as is", "steps",
          "Steps from a chunk's KV fully written to complete_store (loadable), median.", STORE_DELAY_VERSION),
    Track("store_visible_delay_steps_p99", "store_visible_delay_p99", "as is", "steps", "", STORE_DELAY_VERSION),
    Track("tokens_per_s_modeled", "seconds_per_output_token_modeled", "1 / x", "s/token (modeled)",
          "1 / tokens_per_s_modeled (cost model, hardware profile of the workload)."),
    Track("connector_us_per_step", "connector_us_per_step", "as is", "µs/step",
          "Wall time in connector calls per step, both sides: median of the -small workload's replays.",
          measured=True),
    Track("sim_requests_per_s", "sim_seconds_per_request", "1 / x", "s/request",
          "Simulator wall time per replayed request, 1 / sim_requests_per_s: median of the -small "
          "workload's replays.", measured=True),
    Track("preemptions", "preemptions", "as is", "preemptions", "Recompute preemptions."),
)

# Glossary metrics no track follows, each with its reason.
NOT_TRACKED: dict[str, str] = {
    "last_block_eligible": "the denominator of last_block_miss_rate: its changes show in that rate",
    "copy_gb_per_s": "measured copy bandwidth: bench_transfer.TransferCopy times the copy path on its own",
    "requests": "fixed by the workload definition, not by the code under test",
    "prompt_tokens": "fixed by the workload definition, not by the code under test",
    "output_tokens": "fixed by the workload definition (stops short only with a crash, which is tracked)",
    "steps": "priced by the cost model: tracked as seconds_per_output_token_modeled",
}
# A real model's metrics (--engine vllm): bench_real_model.py tracks throughput and TTFT on the
# tiny model; the rest are counts and diagnostics of that run.
NOT_TRACKED.update({
    "output_tokens_per_s": "real model: tracked by bench_real_model as seconds_per_output_token",
    "total_tokens_per_s": "real model: follows output_tokens_per_s (the same wall time, fixed token counts)",
    "ttft_ms_p50": "real model: tracked by bench_real_model as ttft_ms_p50",
    "ttft_ms_p99": "real model: tracked by bench_real_model as ttft_ms_p99",
    "tpot_ms_p50": "real model: tracked by bench_real_model as tpot_ms_p50",
    "tpot_ms_p99": "real model: one slow iteration on a shared CPU sets it; p50 is tracked",
    "prefill_tokens_computed": "real model: the complement of prefill_tokens_saved in a fixed workload",
    "prefill_tokens_saved": "real model: offload_miss_rate tracks the connector's share",
    "output_mismatches": "real model: a correctness verdict, asserted by tests/vllm and the CI vLLM stage",
    "wall_seconds": "real model: tracked as seconds_per_output_token (its inverse per token)",
    "engine_start_seconds": "real model: vLLM's start-up, not the code under test",
})

FORMS = {
    "as is": lambda value: value,
    "1 - x": lambda rate: None if rate is None else 1.0 - rate,
    "1 / x": lambda rate: None if not rate else 1.0 / rate,
}


def tracked_metrics(metrics: dict) -> dict[str, float | None]:
    """A run's metrics (glossary names) as {track name: lower-is-better value}.

    A metric absent from the run (an older commit's package) is None: asv records n/a.
    """
    return {track.name: FORMS[track.form](metrics.get(track.metric)) for track in TRACKS}


def refusals(workload_name: str, connectors: list[str]) -> dict[str, str]:
    """{connector: why} for the presets whose release rules cannot replay the workload's model
    (``Fixes.check_model``; none for a bundled model today)."""
    from kvoffload.workloads import load_workload

    model, refused = load_workload(workload_spec(workload_name)).engine.kv_model, {}
    for label in connectors:
        try:
            connector_choice(label).fixes.check_model(model)
        except ValueError as error:  # ConfigError
            refused[label] = str(error)
    return refused


def replay_connectors(workload_name: str, connectors: list[str]) -> dict[str, dict[str, float | None]]:
    """Replay one workload through each connector configuration: {connector: tracked metrics}."""
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(workload_spec(workload_name))
    return {label: tracked_metrics(replay_workload(workload, connector_choice(label)).result["metrics"])
            for label in connectors}


def sample_connectors(workload_name: str, connectors: list[str], repeat: int) -> list[dict[str, dict]]:
    """``repeat`` rounds, each one replay of the workload per connector: [{connector: tracked metrics}].

    Round by round, not connector by connector: a burst of load from another process lands on
    one round of every connector, and shows as spread, rather than on every sample of one.
    """
    from kvoffload.runner import replay_workload
    from kvoffload.workloads import load_workload

    workload = load_workload(workload_spec(workload_name))
    return [{label: tracked_metrics(replay_workload(workload, connector_choice(label)).result["metrics"])
             for label in connectors} for _ in range(repeat)]


def replay_suite(tracked: dict[str, str], measured: dict[str, str], repeat: int) -> dict:
    """Every replay the Track* and Measure* classes read, in one process.

    ``tracked``: {workload kind: definition replayed once per connector}; ``measured``: {kind:
    definition replayed ``repeat`` times per connector}. Returns ``{"tracks": {kind: {connector:
    tracked metrics}}, "samples": {kind: {connector: {measured track: [samples]}}}, "errors":
    {kind: reason}, "refused": {"kind/connector": reason}}``. The full replays run first, so the
    measured ones find the process warm (imports done, code paths taken). A workload this commit's
    package cannot replay is one error for that workload's tracks; the other workloads are still
    recorded. A connector refusing a workload's model (``refusals``) skips it (``_skip_refused``).
    """
    found: dict = {"tracks": {}, "samples": {}, "errors": {}, "refused": {}}
    runnable: dict[str, list[str]] = {}
    for kind, name in {**measured, **tracked}.items():
        try:
            refused = refusals(name, CONNECTORS)
        except Exception:  # a workload the package cannot read: its replay below says why
            refused = {}
        runnable[kind] = [label for label in CONNECTORS if label not in refused]
        found["refused"].update({f"{kind}/{label}": reason for label, reason in refused.items()})
    for kind, name in tracked.items():
        try:
            found["tracks"][kind] = replay_connectors(name, runnable[kind])
        except Exception as error:  # an old commit's package: asv shows the tracks as failed
            found["errors"][f"Track {kind}"] = f"{name}: {type(error).__name__}: {error}"
    measured_names = [track.name for track in TRACKS if track.measured]
    for kind, name in measured.items():
        try:
            rounds = sample_connectors(name, runnable[kind], repeat)
        except Exception as error:
            found["errors"][f"Measure {kind}"] = f"{name}: {type(error).__name__}: {error}"
            continue
        found["samples"][kind] = {label: {track: [tracked[label][track] for tracked in rounds]
                                          for track in measured_names} for label in runnable[kind]}
    return found


def _replay_every_workload(self):
    """The setup_cache of every replay class: asv keys a cache by the function's module and line,
    so this one function is one cache, made once per commit in one process: the replay code is
    imported and warmed once, and the measured replays follow the full ones in a warm process."""
    return replay_suite({kind: kind for kind in WORKLOADS}, {kind: f"{kind}-small" for kind in WORKLOADS},
                        MEASURE_REPEAT)


def _skip_refused(self, cache, connector):
    """asv's setup: a connector that refuses the workload's model (``refusals``) skips this
    benchmark for that parameter (asv records n/a, naming the reason in its log)."""
    reason = cache.get("refused", {}).get(f"{self.workload}/{connector}")
    if reason is not None:
        raise NotImplementedError(reason)


def _checked(cache: dict, role: str, workload: str) -> None:
    error = cache["errors"].get(f"{role} {workload}")
    if error is not None:
        raise RuntimeError(f"could not replay {error}")


def _track_method(track: Track):
    """The ``track_<name>`` method of one deterministic Track: it reads the cached replay."""
    def method(self, cache, connector):
        _checked(cache, "Track", self.workload)
        value = cache["tracks"][self.workload][connector][track.name]
        return math.nan if value is None else float(value)  # NaN: asv records n/a

    return _described(method, track)


def _measure_method(track: Track):
    """The ``track_<name>`` method of one measured Track: the cached samples, in asv's timing form."""
    def method(self, cache, connector):
        _checked(cache, "Measure", self.workload)
        samples = [v for v in cache["samples"][self.workload][connector][track.name] if v is not None]
        if not samples:
            return math.nan
        return asv_samples(samples)

    return _described(method, track)


def _described(method, track: Track):
    method.__name__ = method.__qualname__ = f"track_{track.name}"
    method.__doc__ = track.doc or f"{track.metric} ({track.form})"
    method.unit = track.unit
    method.version = track.version
    return method


class _ReplayTracks:
    """The deterministic tracks of one workload's full replay; subclasses name the workload.

    The ``track_`` methods are made from TRACKS, one per deterministic row, below the class.
    """

    workload = ""
    params = [CONNECTORS]
    param_names = ["connector"]
    # asv gives the shared setup_cache the largest timeout of its users: 15 full replays and 75
    # small ones in one process (the full replays of 22ea7cf took 653 s on 2 cores at load 12-28)
    timeout = 3600
    setup_cache = _replay_every_workload
    setup = _skip_refused


class _MeasureTracks:
    """The measured tracks of one workload (its -small definition), with repeated samples."""

    workload = ""
    params = [CONNECTORS]
    param_names = ["connector"]
    timeout = 3600
    setup_cache = _replay_every_workload
    setup = _skip_refused


for _track in TRACKS:
    if _track.measured:
        setattr(_MeasureTracks, f"track_{_track.name}", _measure_method(_track))
    else:
        setattr(_ReplayTracks, f"track_{_track.name}", _track_method(_track))
del _track


# One Track<Workload> and one Measure<Workload> class per tracked workload (TrackMultiTurn,
# MeasureQwen3NextSpecDecode, ...): asv finds them by name, and the names are its history keys.
for _workload in WORKLOADS:
    _camel = "".join(part.capitalize() for part in _workload.split("-"))
    globals()[f"Track{_camel}"] = type(f"Track{_camel}", (_ReplayTracks,), {"workload": _workload})
    globals()[f"Measure{_camel}"] = type(f"Measure{_camel}", (_MeasureTracks,), {"workload": _workload})
del _workload, _camel


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
