"""Each engine setting the vllm-scheduler engine honours reaches vLLM (kvoffload/vllm/settings.py):
set to a value other than its default, vLLM's own objects carry it, for our connector and for
vLLM's stock one. Refused settings stop the run with one line and exit 2, nothing written."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402

from kvoffload.cli import main  # noqa: E402
from kvoffload.core.model import MODELS, GroupKind  # noqa: E402
from kvoffload.engine.config import EngineConfig  # noqa: E402
from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.vllm.build import ConnectorLoad  # noqa: E402
from kvoffload.vllm.replay import VllmSchedulerReplay  # noqa: E402
from kvoffload.vllm.settings import HONOURED, REFUSED, REFUSED_FOR_STOCK  # noqa: E402

BASE = EngineConfig(gpu_blocks=40, cpu_chunks=24, block_size=16, blocks_per_chunk=2, max_num_seqs=8,
                    max_num_batched_tokens=256)


def _stock(replay):
    return replay.scheduler.connector.connector_scheduler


def _handlers(replay):
    worker = replay.worker
    inner = getattr(worker, "worker", None) or worker.connector_worker.worker
    return inner.handler.handlers


# setting -> (a value other than BASE's, what vLLM holds with our connector, with stock); None: as ours
READERS = {
    "gpu_blocks": (24, lambda r: r.scheduler.kv_cache_manager.block_pool.num_gpu_blocks, None),
    "cpu_chunks": (7, lambda r: r.scheduler.connector.config.cpu_chunks, lambda r: _stock(r).manager._num_chunks),
    "block_size": (32, lambda r: r.scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size, None),
    "blocks_per_chunk": (4, lambda r: r.scheduler.connector.config.blocks_per_chunk,
                         lambda r: _stock(r).config.blocks_per_chunk),
    "offload_prompt_only": (not BASE.offload_prompt_only, lambda r: r.scheduler.connector.config.offload_prompt_only,
                            lambda r: _stock(r).config.offload_prompt_only),
    "max_num_seqs": (3, lambda r: r.scheduler.max_num_running_reqs, None),
    "max_num_batched_tokens": (96, lambda r: r.scheduler.max_num_scheduled_tokens, None),
    "spec_tokens": (3, lambda r: r.scheduler.num_spec_tokens, None),
    "eagle_drafts": (1, lambda r: r.scheduler.connector.config.eagle_drafts,
                     lambda r: r.scheduler.num_spec_tokens if r.scheduler.use_eagle else 0),
    "spec_acceptance": (0.0, lambda r: accepted_drafts(r), None),
    "store_completion_steps": (4, lambda r: {h.completion_steps for h in _handlers(r)}.pop(), None),
    "seed": (11, lambda r: r.config.model_config.seed, None),
    "strict_lifecycle": (False, lambda r: r.scheduler.connector.core.manager.strict_lifecycle, None),
    "scheduling": ("async", lambda r: "async" if isinstance(r.scheduler, AsyncScheduler) else "sync", None),
    "reserve_full_isl": (False, lambda r: r.scheduler.scheduler_reserve_full_isl, None),
    "model": ("gpt-oss", lambda r: model_of(r), None),
    "prefix_cache_retention_interval": (None, lambda r: r.config.cache_config.prefix_cache_retention_interval,
                                        lambda r: _stock(r).config.retention_interval),
}


def model_of(replay) -> str:
    """The model description whose groups vLLM's KV cache config holds (kind and window)."""
    groups = [(type(g.kv_cache_spec).__name__, getattr(g.kv_cache_spec, "sliding_window", None) or 0)
              for g in replay.scheduler.kv_cache_config.kv_cache_groups]
    spec = {GroupKind.FULL_ATTENTION: "FullAttentionSpec", GroupKind.SLIDING_WINDOW: "SlidingWindowSpec"}
    return next(model.name for model in MODELS.values()
                if [(spec.get(g.kind), g.sliding_window) for g in model.groups] == groups)


def accepted_drafts(replay) -> float:
    """The share of drafts the replay's model accepted on one request with no scripted acceptance
    (k=2): the setting shows in the run, not in a config."""
    replay.run()
    drafts = sum(replay._spec_steps.values()) * 2
    output = replay.record.output_tokens
    steps = sum(replay._spec_steps.values())
    return round((output - 1 - steps) / drafts, 1) if drafts else 0.0


def replay_with(name: str, value, source: str) -> VllmSchedulerReplay:
    base = BASE
    if name == "eagle_drafts":  # modelled on a full-attention and Mamba model only (engine/config.py)
        base = BASE.replace(model="qwen3-next", blocks_per_chunk=1)
    engine = base.replace(**{name: value})
    if name == "spec_acceptance":  # drafts need k > 0 and a request long enough to decode
        engine = engine.replace(spec_tokens=2)
    request = RequestSpec("A", tuple(range(3, 43)), tuple(range(50, 70)))
    return VllmSchedulerReplay([request], engine, ConnectorLoad(source))


def test_every_honoured_setting_has_a_reader():
    assert set(READERS) == set(HONOURED)


@pytest.mark.vllm_on_demand  # about 4 s: scripts/vllm-on-demand (CI keeps the refusals below)
@pytest.mark.parametrize("name", sorted(HONOURED))
def test_a_setting_reaches_vllm(name):
    value, ours, stock = READERS[name]
    assert ours(replay_with(name, getattr(BASE, name), "reference")) != value  # the reader tells them apart
    assert ours(replay_with(name, value, "reference")) == value
    if name not in REFUSED_FOR_STOCK:
        assert (stock or ours)(replay_with(name, value, "stock")) == value


@pytest.mark.parametrize("argv, message", [
    (["--set", "workers=2"], f"workers=2 is not honoured by --engine vllm-scheduler: {REFUSED['workers']}"),
    (["--set", "profile=h200-llama3-8b"], "profile='h200-llama3-8b' is not honoured by --engine vllm-scheduler"),
    (["--connector", "stock", "--set", "strict_lifecycle=false"],
     "strict_lifecycle=False is not honoured by --engine vllm-scheduler with --connector stock"),
])
def test_a_refused_setting_is_a_one_line_error(tmp_path, capsys, argv, message):
    out = tmp_path / "x.json"
    code = main(["run", "--engine", "vllm-scheduler", "--workload", "shared-prefix-small", "--quiet",
                 "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
