"""bench_workloads: the replay classes run on the -small workload of their kind.

The suite's Track classes replay the full workloads under asv (the Measure classes the -small
ones, five times); here the same code replays the -small definitions (twice for the samples),
and every tracked number is checked to be the lower-is-better form of a metric.
"""

from __future__ import annotations

import fnmatch
import json
import math
import pickle
from pathlib import Path

import pytest

from kvoffload.core.fixes import Fixes, MambaStores
from kvoffload.metrics import GLOSSARY, MODEL_METRICS
from kvoffload.runner import ConnectorChoice, replay_workload
from kvoffload.workloads import load_workload

TRACK_CLASSES = ("TrackSharedPrefix", "TrackMultiTurn", "TrackSpecDecode", "TrackGptOssMultiTurn",
                 "TrackGptOssSpecDecode", "TrackQwen3NextMultiTurn", "TrackQwen3NextSpecDecode")
MEASURE_CLASSES = ("MeasureSharedPrefix", "MeasureMultiTurn", "MeasureSpecDecode", "MeasureGptOssMultiTurn",
                   "MeasureGptOssSpecDecode", "MeasureQwen3NextMultiTurn", "MeasureQwen3NextSpecDecode")
KINDS = ("shared-prefix", "multi-turn", "spec-decode", "gpt-oss-multi-turn", "gpt-oss-spec-decode",
         "qwen3-next-multi-turn", "qwen3-next-spec-decode")
# A preset that refuses a model (Fixes.check_model) is skipped, not replayed. None refuses a bundled
# model today: the refusal is planted for the presets that store a Mamba group from its block table.
REFUSED = dict.fromkeys(("qwen3-next-multi-turn", "qwen3-next-spec-decode"), ("vllm-0.25", "vllm-0.26", "vllm-0.28"))
REASON = "planted: this preset's Mamba stores are not modelled"


def planted_refusal(self, model):
    return REASON if model.has_mamba and self.rules.mamba_stores is MambaStores.BLOCK_TABLE else None
REPEAT = 2
REPO = Path(__file__).resolve().parents[2]
# No eligible continuation (prompt-only offload) or no store at all: a run may have no value.
MAY_LACK_A_VALUE = {"track_last_block_miss_rate"} | {f"track_store_{kind}_delay_{p}"
                                                     for kind in ("submit", "visible") for p in ("p50", "p99")}


@pytest.fixture(scope="module")
def module(suite):
    return suite("bench_workloads")


@pytest.fixture(scope="module")
def cache(module):
    """The shared setup_cache's replays on the -small workloads: once per connector for the
    deterministic tracks, REPEAT rounds for the measured ones."""
    small = {kind: f"{kind}-small" for kind in KINDS}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Fixes, "model_refusal", planted_refusal)
        return module.replay_suite(small, small, REPEAT)


def runnable(module, workload):
    return [connector for connector in module.CONNECTORS if connector not in REFUSED.get(workload, ())]


def track_values(module, class_name, cache, methods_of):
    cls = getattr(module, class_name)
    bench = cls()
    return {(connector, method): getattr(bench, method)(cache, connector)
            for connector in runnable(module, cls.workload) for method in methods_of(cls)}


@pytest.mark.parametrize("class_name", TRACK_CLASSES + MEASURE_CLASSES)
def test_a_connector_that_refuses_the_model_skips_its_benchmarks_with_the_reason(module, cache, class_name):
    """asv skips a benchmark whose setup raises NotImplementedError (n/a, no failure): the presets
    that cannot replay a Mamba group are skipped there, with check_model's reason; every other
    connector is replayed and runs."""
    cls = getattr(module, class_name)
    refused = REFUSED.get(cls.workload, ())
    for connector in module.CONNECTORS:
        if connector in refused:
            with pytest.raises(NotImplementedError, match=REASON):
                cls().setup(cache, connector)
        else:
            assert cls().setup(cache, connector) is None
    assert [c for c in module.CONNECTORS if f"{cls.workload}/{c}" in cache["refused"]] == list(refused)
    assert set(cache["tracks"][cls.workload]) == set(runnable(module, cls.workload))


def test_every_replay_class_shares_one_setup_cache(module):
    """asv keys a cache by the setup_cache function's module and line: one function, one process
    replays everything once per commit."""
    from asv_runner.benchmarks._base import get_setup_cache_key

    keys = {get_setup_cache_key(getattr(module, name).setup_cache) for name in TRACK_CLASSES + MEASURE_CLASSES}
    assert len(keys) == 1 and None not in keys


@pytest.mark.parametrize("class_name", TRACK_CLASSES)
def test_every_track_runs_and_is_a_number_with_a_unit(module, cache, class_name, methods_of):
    cls = getattr(module, class_name)
    methods = methods_of(cls)
    assert methods and all(m.startswith("track_") for m in methods)
    for method in methods:
        assert getattr(cls, method).unit, f"{class_name}.{method} has no unit"
    tracks = cache["tracks"][cls.workload]
    values = track_values(module, class_name, cache, methods_of)
    assert all(isinstance(v, float) for v in values.values())
    # NaN (asv's n/a) exactly where the run has no value, and only for metrics that may lack one
    nan = {(connector, method) for (connector, method), v in values.items() if math.isnan(v)}
    missing = {(connector, "track_" + name) for connector, tracked in tracks.items()
               for name, v in tracked.items() if v is None and f"track_{name}" in methods}
    assert nan == missing
    assert {method for _, method in nan} <= MAY_LACK_A_VALUE, nan
    for (connector, method), v in values.items():
        if not math.isnan(v):
            assert v == pytest.approx(tracks[connector][method[len("track_"):]]) and v >= 0, (connector, method)
    assert pickle.loads(pickle.dumps(cache)) == cache  # asv pickles the cache between processes


@pytest.mark.parametrize("class_name", MEASURE_CLASSES)
def test_every_measured_track_returns_its_samples_in_asvs_timing_form(module, cache, class_name, methods_of):
    """A measured track is REPEAT replays' values, which asv keeps with its statistics."""
    cls = getattr(module, class_name)
    assert methods_of(cls) == sorted(f"track_{t.name}" for t in module.TRACKS if t.measured)
    samples = cache["samples"][cls.workload]
    for connector in runnable(module, cls.workload):
        for method in methods_of(cls):
            result = getattr(cls(), method)(cache, connector)
            assert result["number"] == 1 and len(result["samples"]) == REPEAT
            assert result["samples"] == samples[connector][method[len("track_"):]]
            assert all(v > 0 for v in result["samples"]), (connector, method)


def test_the_deterministic_tracks_are_equal_on_every_replay(module, cache):
    """One evaluation of a deterministic track is the whole truth: another replay of the same
    workload and connector gives every deterministic track the same value, to the bit."""
    deterministic = [t.name for t in module.TRACKS if not t.measured]
    for kind in KINDS:
        (again,) = module.sample_connectors(f"{kind}-small", runnable(module, kind), 1)
        for connector in runnable(module, kind):
            first = {name: cache["tracks"][kind][connector][name] for name in deterministic}
            second = {name: again[connector][name] for name in deterministic}
            assert repr(second) == repr(first), (kind, connector)  # repr: NaN and None compare too


def test_a_workload_the_package_cannot_replay_fails_only_its_own_tracks(module):
    """An old commit's package that cannot read one workload: that workload's tracks fail with the
    reason (asv shows them as failed), the others are still recorded."""
    found = module.replay_suite({"shared-prefix": "shared-prefix-small", "multi-turn": "no-such-workload"}, {}, 1)
    assert set(found["tracks"]) == {"shared-prefix"}
    assert "no-such-workload" in found["errors"]["Track multi-turn"]
    assert module.TrackSharedPrefix().track_crashes(found, "reference") == 0.0
    with pytest.raises(RuntimeError, match="could not replay no-such-workload"):
        module.TrackMultiTurn().track_crashes(found, "reference")


@pytest.mark.parametrize("class_name", TRACK_CLASSES)
def test_the_reference_tracks_zero_harm(module, cache, class_name, methods_of):
    """Every track of a glossary metric that must stay zero is 0 for the reference."""
    values = track_values(module, class_name, cache, methods_of)
    # The real-model metrics (output_mismatches) exist only where a model ran, never in the simulator.
    must_be_zero = {metric.name for metric in GLOSSARY if metric.better == "zero"} - MODEL_METRICS
    zero_tracks = [f"track_{track.name}" for track in module.TRACKS if track.metric in must_be_zero]
    assert len(zero_tracks) == len(must_be_zero)  # every one of them is tracked
    for method in zero_tracks:
        assert values[("reference", method)] == 0.0, method


def test_tracked_numbers_are_the_lower_is_better_forms(module):
    metrics = replay_workload(load_workload("multi-turn-small"), ConnectorChoice.build("vllm-0.25")).result["metrics"]
    tracked = module.tracked_metrics(metrics)
    assert tracked["last_block_miss_rate"] == pytest.approx(1 - metrics["last_block_hit_rate"])
    assert tracked["offload_miss_rate"] == pytest.approx(1 - metrics["offload_hit_rate"])
    assert tracked["seconds_per_output_token_modeled"] == pytest.approx(1 / metrics["tokens_per_s_modeled"])
    assert tracked["sim_seconds_per_request"] == pytest.approx(1 / metrics["sim_requests_per_s"])
    assert tracked["store_submit_delay_p99"] == metrics["store_submit_delay_steps_p99"]
    assert tracked["repeated_lookups"] == metrics["repeated_lookups"]
    assert set(tracked) == {track.name for track in module.TRACKS}


def test_every_glossary_metric_is_tracked_or_excluded_with_a_reason(module, methods_of):
    """The glossary owns the metrics: a metric added there needs a track or a stated reason."""
    glossary = [metric.name for metric in GLOSSARY]
    tracked = [track.metric for track in module.TRACKS]
    assert len(tracked) == len(set(tracked)), "a glossary metric tracked twice"
    assert not set(tracked) & set(module.NOT_TRACKED), "tracked and excluded at once"
    assert sorted(tracked + list(module.NOT_TRACKED)) == sorted(glossary)
    assert all(reason.strip() for reason in module.NOT_TRACKED.values())
    assert {track.form for track in module.TRACKS} <= set(module.FORMS)
    # a form matches the metric's direction: asv reads every track as lower-is-better
    better = {metric.name: metric.better for metric in GLOSSARY}
    for track in module.TRACKS:
        assert (track.form == "as is") == (better[track.metric] != "higher"), track
    # every row is a method of every workload class of its kind (Track: deterministic, Measure:
    # measured), with its unit and version, and nothing else is
    for class_name in TRACK_CLASSES + MEASURE_CLASSES:
        cls = getattr(module, class_name)
        rows = [track for track in module.TRACKS if track.measured == (class_name in MEASURE_CLASSES)]
        assert methods_of(cls) == sorted(f"track_{track.name}" for track in rows)
        for track in rows:
            method = getattr(cls, f"track_{track.name}")
            assert (method.unit, method.version) == (track.unit, track.version)
    # measured: exactly the tracked glossary metrics the glossary marks as measured
    from kvoffload.metrics import MEASURED_MARK

    measured = {metric.name for metric in GLOSSARY if metric.definition.startswith(MEASURED_MARK)}
    assert {track.metric for track in module.TRACKS if track.measured} == measured & set(tracked)


def test_recorded_tracks_keep_their_asv_name_version_and_unit(module):
    """asv keys history by benchmark name and version: a track recorded in results/asv/benchmarks.json
    is still in the suite under that name, with that version and unit, as asv discovers it."""
    from asv_runner.discovery import _get_benchmark

    recorded = json.loads((REPO / "results" / "asv" / "benchmarks.json").read_text())
    found = {}
    for class_name in TRACK_CLASSES + MEASURE_CLASSES:
        cls = getattr(module, class_name)
        for attr in dir(cls):
            benchmark = _get_benchmark(attr, module, cls, getattr(cls, attr))
            if benchmark is not None:
                found[benchmark.name] = (benchmark.version, benchmark.unit)
    recorded_tracks = {name: (entry["version"], entry["unit"]) for name, entry in recorded.items()
                       if name.startswith(("bench_workloads.Track", "bench_workloads.Measure"))}
    assert recorded_tracks, "no recorded track in results/asv/benchmarks.json"
    assert {name: found.get(name) for name in recorded_tracks} == recorded_tracks


def test_the_benchmarks_readme_names_every_track(module):
    readme = (REPO / "benchmarks" / "README.md").read_text()
    assert [t.name for t in module.TRACKS if f"`{t.name}`" not in readme] == []
    assert [name for name in module.NOT_TRACKED if f"`{name}`" not in readme] == []


def test_the_last_block_fix_shows_as_a_lower_miss_rate(module, cache):
    """multi-turn-small: vLLM 0.25 lacks last_block_at_finish and misses last chunks the reference serves."""
    bench = module.TrackMultiTurn()
    reference = bench.track_last_block_miss_rate(cache, "reference")
    old = bench.track_last_block_miss_rate(cache, "vllm-0.25")
    # Not 0 for the reference either: with blocks_per_chunk 2, a continuation whose GPU hit ends
    # inside its parent's last chunk has less than a whole chunk to load, which vLLM's
    # complete-chunk rule reports as no hit (docs/design.md, "Connector rules").
    assert old > reference


def test_a_metric_without_a_value_is_nan_for_asv(module, cache):
    """shared-prefix offloads prompts only: no continuation is eligible, asv shows n/a."""
    bench = module.TrackSharedPrefix()
    assert math.isnan(bench.track_last_block_miss_rate(cache, "reference"))


def test_workload_generation_generates_the_workload(module, methods_of):
    bench = module.GenerateWorkload()
    bench.setup("spec-decode-small")
    expected = load_workload("spec-decode-small").requests
    assert methods_of(module.GenerateWorkload) == ["peakmem_generate", "time_generate"]
    for method in methods_of(module.GenerateWorkload):
        bench.generated = None
        assert getattr(bench, method)("spec-decode-small") is None
        assert bench.generated.requests == expected and len(expected) > 0


def test_workloads_resolve_to_this_checkouts_definitions(module):
    path = module.workload_spec("multi-turn")
    assert path.endswith("workloads/multi-turn.toml")
    assert load_workload(path).requests == load_workload("multi-turn").requests


def test_every_track_version_has_its_change_listed(module):
    """A track at a version past 1 changed meaning at a commit: benchmarks/record records it only
    from there, and the charts mark it, both from the one list of changes (report/changes.csv)."""
    from kvoffload.report.changes import read_changes

    listed = {(glob, c.version) for c in read_changes() if c.version for glob in c.metric.split()}
    for track in module.TRACKS:
        if track.version != "1":
            assert any(fnmatch.fnmatchcase(track.name, glob) and version == track.version
                       for glob, version in listed), f"{track.name} v{track.version}: no row in changes.csv"
    for glob, version in listed:
        assert any(fnmatch.fnmatchcase(t.name, glob) and t.version == version for t in module.TRACKS), \
            f"changes.csv: {glob} v{version} matches no track of that version"
