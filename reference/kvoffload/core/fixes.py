"""The reference connector's fix flags: each one a rule a past vLLM release got wrong.

Every flag is on by default. Switching one off makes the reference behave exactly like the vLLM
release that lacked that fix, so the historical bug can be replayed deterministically. Presets
switch off what each vLLM release lacked (release table: notes F.1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvoffload.core.types import ConfigError


@dataclass(frozen=True)
class FixInfo:
    name: str
    rule: str
    reproduces: str
    first_release: str


FIX_INFO: tuple[FixInfo, ...] = (
    FixInfo(
        "last_block_at_finish",
        "finished requests stay tracked; offload keys are refreshed at finish; the next "
        "build_connector_meta walks finished_req_ids too, so the chunk completed last is stored",
        "vLLM PR #48596 (scheduler half): the final chunk of a request was never offloaded",
        "0.26.0",
    ),
    FixInfo(
        "flush_submits_before_wait",
        "the worker moves this plan's flushed store jobs into its queue and submits the whole "
        "queue before waiting on jobs_to_flush",
        "vLLM PR #48596 (worker half): wait() ignored the never-submitted final store, the block "
        "was reused and the late copy stored another request's KV (poisoned chunk)",
        "0.26.0",
    ),
    FixInfo(
        "deferred_finish_signal",
        "manager.on_request_finished is called only after the finished request's final stores "
        "were built (post-pass of build_connector_meta); state is dropped once signalled and "
        "drained, also through reset_cache",
        "vLLM issue #49635 / PR #49671: prepare_store after on_request_finished (KeyError in the "
        "tiering manager, EngineCore dead); final store silently dropped when the last job "
        "completed in the EOS step",
        "0.27.0",
    ),
    FixInfo(
        "final_token_watermark",
        "a finished (not aborted) request stores up to max(num_prompt_tokens, num_tokens - 1): "
        "the final sampled token's slot was never written by a forward pass",
        "vLLM issue #54193 / PR #54288: a chunk ending on the final token was stored with an "
        "unwritten or rejected-draft slot (poisoned load on the next turn)",
        "0.30.0",
    ),
    FixInfo(
        "aborted_watermark",
        "an aborted request stores only up to num_computed_tokens",
        "vLLM PR #49285: aborted requests were stored up to num_tokens (unwritten prompt slots)",
        "0.27.0",
    ),
    FixInfo(
        "storable_within_allocated",
        "never offer a chunk beyond the request's allocated blocks or its known offload keys",
        "vLLM issues #49118 / #52170 (PRs #49146, #52923): assert len(keys) == len(block_ids) "
        "killed the engine (queued abort, blocks allocated before their hash)",
        "0.27.0 (allocated blocks); 0.30.0 (known keys)",
    ),
    FixInfo(
        "defer_lookup_while_transferring",
        "get_num_new_matched_tokens returns 'not yet' while the request still has jobs in flight",
        "vLLM issue #46014 / PR #46231: a re-admitted request got a load while its flushed stores "
        "were unreported (assert not transfer_jobs crash)",
        "0.24.0",
    ),
    FixInfo(
        "reset_clears_request_jobs",
        "reset_cache drops job ids from surviving requests, not only from the job table",
        "vLLM PR #48102: stale job ids made lookups defer forever (request stuck, state leaked)",
        "0.26.0",
    ),
)

FIX_NAMES: tuple[str, ...] = tuple(info.name for info in FIX_INFO)


@dataclass(frozen=True)
class Fixes:
    """Which fixes the reference connector applies. All on: vLLM 0.30 semantics and beyond."""

    last_block_at_finish: bool = True
    """PR #48596 scheduler half: store the chunk completed last, from finished_req_ids."""
    flush_submits_before_wait: bool = True
    """PR #48596 worker half: submit flushed jobs of the current plan before waiting on them."""
    deferred_finish_signal: bool = True
    """Issue #49635 / PR #49671: signal on_request_finished after the final store was built."""
    final_token_watermark: bool = True
    """Issue #54193 / PR #54288: finished watermark max(num_prompt_tokens, num_tokens - 1)."""
    aborted_watermark: bool = True
    """PR #49285: aborted requests store up to num_computed_tokens only."""
    storable_within_allocated: bool = True
    """Issues #49118 / #52170: storable chunks <= allocated blocks and known keys."""
    defer_lookup_while_transferring: bool = True
    """Issue #46014 / PR #46231: no lookup while the request has jobs in flight."""
    reset_clears_request_jobs: bool = True
    """PR #48102: reset_cache clears surviving requests' job ids."""

    def without(self, *names: str) -> "Fixes":
        for name in names:
            if name not in FIX_NAMES:
                raise ConfigError(f"unknown fix {name!r} (known: {', '.join(FIX_NAMES)})")
        return dataclasses.replace(self, **{name: False for name in names})

    def disabled(self) -> tuple[str, ...]:
        return tuple(name for name in FIX_NAMES if not getattr(self, name))

    def as_dict(self) -> dict[str, bool]:
        return {name: getattr(self, name) for name in FIX_NAMES}

    @classmethod
    def preset(cls, name: str) -> "Fixes":
        try:
            missing = PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})") from None
        return cls().without(*missing)


# What each vLLM release lacked (notes F.1; C.5 and C.8 for the smaller fixes).
# 0.29 already had #49146 (allocated-block clamp) but not #52923 (known-key clamp); the reference
# has one flag for both and keeps it on for 0.29, whose common crash (#49118) was fixed.
PRESETS: dict[str, tuple[str, ...]] = {
    "vllm-0.25": (
        "last_block_at_finish",
        "flush_submits_before_wait",
        "deferred_finish_signal",
        "final_token_watermark",
        "aborted_watermark",
        "storable_within_allocated",
        "reset_clears_request_jobs",
    ),
    "vllm-0.26": (
        "deferred_finish_signal",
        "final_token_watermark",
        "aborted_watermark",
        "storable_within_allocated",
    ),
    "vllm-0.29": ("final_token_watermark",),
    "vllm-0.30": (),
}


def presets_lacking(fix_name: str) -> tuple[str, ...]:
    return tuple(preset for preset, missing in PRESETS.items() if fix_name in missing)
