"""What every vLLM gate story needs: tokens, a tiny engine config, a bounded replay through
vLLM's scheduler with the connector under test, and the hooks a story may need (the GPU cache
forgetting its free blocks, a reset between two steps, copies that fail).

Block size 4 and one block per chunk unless a story says otherwise, so positions 0-3 are chunk
0, 4-7 chunk 1, and so on (the stories of tests/gates, told to vLLM's scheduler).
"""

from __future__ import annotations

import pytest

from kvoffload.core.types import TransferKind
from kvoffload.engine.config import EngineConfig
from kvoffload.engine.requests import RequestSpec

TINY = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
MAX_STEPS = 400  # far above any story's length, far below a hang


def tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))


def follow_up(parent: RequestSpec, req_id: str = "C", new: int = 4, think_steps: int = 3, **kwargs) -> RequestSpec:
    """A next turn: the parent's whole history plus ``new`` tokens."""
    return RequestSpec(req_id, parent.prompt_token_ids + parent.output_token_ids + tokens(77, new),
                       tokens(78, 2), parent=parent.req_id, think_steps=think_steps, **kwargs)


def replay(connector, requests, config: EngineConfig = TINY, *, forget_gpu_cache_before: tuple[int, ...] = (),
           reset_cache_before: tuple[int, ...] = (), prepare=None, reference_only: str | None = None):
    """The record and the replay of ``requests`` through vLLM's scheduler with the connector
    under test. ``forget_gpu_cache_before=(n,)``: vLLM's GPU prefix cache loses every free block
    before step n (memory pressure from elsewhere), so only the connector can serve them.
    ``reset_cache_before=(n,)``: ``reset_prefix_cache(reset_connector=True)`` between steps n-1
    and n, as the simulator's ``reset_cache_at`` (vLLM's API call between two engine steps).
    ``prepare(built)`` runs before the first step (failure injection, tier hooks).
    ``reference_only``: the story needs the reference connector's scheduler core (a subclass's
    too); any other connector skips with this reason, vLLM's stock one before it is built."""
    from kvoffload.vllm.build import STOCK, ConnectorLoad
    from kvoffload.vllm.replay import VllmSchedulerReplay

    if reference_only and connector.source == STOCK:
        pytest.skip(reference_only)
    replays = []

    def on_step(next_step: int, finished: int) -> None:
        scheduler = replays[0].scheduler
        if next_step in reset_cache_before:
            scheduler.reset_prefix_cache(reset_connector=True)
        if next_step in forget_gpu_cache_before:
            forget_free_blocks(scheduler.kv_cache_manager.block_pool)

    built = VllmSchedulerReplay(requests, config, ConnectorLoad(connector.source, connector.preset, connector.disabled),
                                on_step=on_step, max_steps=MAX_STEPS, step_bound_s=connector.step_bound_s)
    replays.append(built)
    try:
        if reference_only and getattr(built.scheduler.connector, "core", None) is None:
            pytest.skip(reference_only)
        if prepare is not None:
            prepare(built)
    except BaseException:  # a skip, or a hook that cannot apply: the built connector stops all the same
        built.close()
        raise
    return built.run(), built


def forget_free_blocks(pool, keep=frozenset()) -> None:
    """vLLM's ``BlockPool`` drops the hash of every free block (``_maybe_evict_cached_block``)
    but those whose ids are in ``keep``."""
    for block in pool.blocks:
        if block.ref_cnt == 0 and block.block_id not in keep:
            pool._maybe_evict_cached_block(block)


LIFECYCLE = "needs the reference manager's lifecycle record (strict mode); this connector has none"
# vLLM's CPU offloading worker asserts that every copy succeeded (``offloading/worker.py``): a copy
# that fails is a crash by design there, not a bug a gate can name. SimpleCPU's worker has no
# failure to report at all (a CUDA copy either runs or faults the device).
FAILING_COPIES = ("needs a tier whose copies can fail and be reported: vLLM's offloading worker asserts every copy "
                  "succeeded, SimpleCPU's reports none")


def fail_first(kind: TransferKind):
    """``prepare`` for a replay whose first copy of ``kind`` fails (the destination scribbled,
    reported ``success=False``), with the reference's stepped handler (``reference_only``)."""
    def prepare(built) -> None:
        from kvoffload.vllm.connector_parts import transfer_handler

        handler = transfer_handler(built.worker)
        failed: list[int] = []

        def fails(job) -> bool:
            if not failed and job.kind is kind:
                failed.append(job.job_id)
            return job.job_id in failed and job.kind is kind

        for part in handler.handlers:
            part.fail_jobs(fails)
    return prepare


def poisoned(record) -> list[tuple[str, int, int]]:
    """(request, chunk, bad slots) of every load that failed the content oracle."""
    return [(p.req_id, p.chunk, p.bad_slots) for p in record.poisoned]


def assert_clean(record, *, finished: int | None = None) -> None:
    """No crash, no poisoned load, nothing stuck or leaked (and ``finished`` requests finished),
    or an AssertionError naming what was seen: the crash and the connector's frame, each poisoned
    load as request, step, chunk and bad slots, the stuck and leaked request ids.

    Lifecycle violations are left to K01's gate, which asserts them itself: a submit-side call
    after ``on_request_finished`` is K01's bug, and only a manager that keeps per-request state
    (vLLM's tiering manager, the reference's strict mode) can see it. vLLM's CPU manager, the tier
    of every story here, keeps none (0.26.0's ``kv_offload/cpu/manager.py`` inherits a no-op
    ``on_request_finished``), so counting the violations in every gate made the 0.26 preset fail
    six gates that vLLM 0.26.0 passes (docs/fidelity.md, "The gates of a preset")."""
    found = record.problems()
    if finished is not None and record.finished_requests != finished:
        found.append(f"{record.finished_requests} of {finished} requests finished")
    if found:
        raise AssertionError("; ".join(found))


def assert_whole_prompt_served(record, tokens: int, connector_at_least: int) -> None:
    """The GPU prefix cache and the connector together gave back ``tokens`` tokens at first
    admissions, the connector at least ``connector_at_least`` of them (which cache keeps the
    head of a prefix depends on the connector: one that pins blocks while it copies them changes
    what the GPU cache evicts first)."""
    gpu, connector = record.gpu_hit_tokens, record.connector_hit_tokens_admitted
    if gpu + connector != tokens or connector < connector_at_least:
        raise AssertionError(f"expected {tokens} tokens back, at least {connector_at_least} from the connector; "
                             f"served {gpu} from the GPU cache + {connector} from the connector")


def assert_served(record, connector: int, gpu: int | None = None) -> None:
    """The tokens the connector supplied at first admissions (and the GPU prefix cache's), as
    expected versus served."""
    expected = (connector,) if gpu is None else (gpu, connector)
    served = ((record.connector_hit_tokens_admitted,) if gpu is None
              else (record.gpu_hit_tokens, record.connector_hit_tokens_admitted))
    if served != expected:
        names = "connector" if gpu is None else "GPU-cache + connector"
        raise AssertionError(f"expected {' + '.join(map(str, expected))} {names} hit tokens, served "
                             f"{' + '.join(map(str, served))}")
