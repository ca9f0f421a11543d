"""The bundled definitions: what each promises about its requests, and that it is repeatable."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from kvoffload.engine.config import EngineConfig
from kvoffload.workloads import (
    DEFAULT_WORKLOAD,
    Workload,
    describe_workload,
    list_workloads,
    load_workload,
    reusable_prompt_share,
)
from kvoffload.workloads.bundled import BUNDLED_WORKLOADS, HYBRID_TWINS, small
from kvoffload.workloads.registry import estimated_arrival_steps
from kvoffload.workloads.spec_decode import ends_on_chunk_after_rejection

BUNDLED = BUNDLED_WORKLOADS
SMALL = tuple(small(name) for name in BUNDLED)


def by_id(workload: Workload):
    return {spec.req_id: spec for spec in workload.requests}


def history(spec):
    return spec.prompt_token_ids + spec.output_token_ids


class TestCatalogue:
    def test_every_workload_comes_in_a_full_and_a_small_size(self):
        names = [name for name, _ in list_workloads()]
        assert names == sorted(BUNDLED + SMALL)
        assert DEFAULT_WORKLOAD == "multi-turn" and DEFAULT_WORKLOAD in names

    @pytest.mark.parametrize("hybrid, dense", sorted(HYBRID_TWINS.items()))
    def test_a_hybrid_workload_replays_its_dense_twins_requests_on_another_model(self, hybrid, dense):
        for name, twin in ((hybrid, dense), (small(hybrid), small(dense))):
            workload, original = load_workload(name), load_workload(twin)
            assert workload.requests == original.requests, name
            assert not workload.engine.kv_model.is_dense and original.engine.kv_model.is_dense
            assert workload.engine.replace(model="dense") == original.engine, name

    def test_descriptions_are_one_line(self):
        for name, description in list_workloads():
            assert description and "\n" not in description, name

    @pytest.mark.parametrize("name", BUNDLED + SMALL)
    def test_loads_under_its_own_name_with_unique_request_ids(self, name):
        workload = load_workload(name)
        assert workload.name == name and workload.source == name
        assert len({spec.req_id for spec in workload.requests}) == len(workload.requests)

    def test_shared_prefix_ids_are_padded_to_the_widest_index_they_hold(self, tmp_path):
        """Ten questions per group are numbered q0..q9: one digit, the width of the last index (9),
        not of the count (10), so ids sort as they read and stay short."""
        bundled = Path(__file__).resolve().parents[2] / "workloads" / "shared-prefix-small.toml"
        text = bundled.read_text().replace("prompts_per_group = 8", "prompts_per_group = 10")
        definition = tmp_path / "ten-per-group.toml"
        definition.write_text(text.replace('name = "shared-prefix-small"', 'name = "ten-per-group"'))
        ids = {spec.req_id for spec in load_workload(str(definition)).requests}
        assert ids == {f"g{group}-q{index}" for group in range(4) for index in range(10)}

    def test_small_sizes_are_small_and_full_sizes_fit_the_benchmark_budget(self):
        # -small: a sub-second engine replay; full: 3 workloads x 5 configurations in 5 minutes.
        for name in SMALL:
            workload = load_workload(name)
            assert 20 <= len(workload.requests) <= 80, name
            assert sum(spec.num_prompt_tokens for spec in workload.requests) < 20_000, name
        for name in ("shared-prefix", "spec-decode"):
            assert 200 <= len(load_workload(name).requests) <= 600, name


class TestDeterminism:
    @pytest.mark.parametrize("name", BUNDLED + SMALL)
    def test_same_definition_and_seed_give_identical_streams(self, name):
        assert load_workload(name) == load_workload(name)

    @pytest.mark.parametrize("name", SMALL)
    def test_a_seed_override_changes_the_stream_and_is_recorded(self, name):
        base = load_workload(name)
        reseeded = load_workload(name, {"seed": str(base.seed + 1)})
        assert reseeded.seed == reseeded.engine.seed == base.seed + 1
        assert [s.prompt_token_ids for s in reseeded.requests] != [s.prompt_token_ids for s in base.requests]
        assert load_workload(name, {"seed": str(base.seed + 1)}) == reseeded

    def test_streams_do_not_depend_on_the_process(self):
        # No str hashing, no global RNG, no clock: another interpreter with another hash seed
        # produces the same tokens.
        script = (
            "import hashlib; from kvoffload.workloads import load_workload\n"
            "h = hashlib.sha256()\n"
            "for name in ('shared-prefix-small', 'multi-turn-small', 'spec-decode-small'):\n"
            "    for s in load_workload(name).requests:\n"
            "        h.update(repr((s.req_id, s.prompt_token_ids, s.output_token_ids, s.arrival_step,\n"
            "                       s.think_steps, s.accept_counts, s.stop)).encode())\n"
            "print(h.hexdigest())\n"
        )
        digests = {
            subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True).stdout
            for seed in ("1", "2")
        }
        assert len(digests) == 1

    def test_engine_overrides_apply_on_top_of_the_file(self):
        workload = load_workload("multi-turn-small", {"gpu_blocks": "512", "scheduling": "sync"})
        assert workload.engine.gpu_blocks == 512 and workload.engine.scheduling == "sync"
        # Only engine settings moved: the requests are the file's.
        assert workload.requests == load_workload("multi-turn-small").requests

    def test_full_multi_turn_generates_in_well_under_a_second(self):
        started = time.perf_counter()
        workload = load_workload("multi-turn")
        assert time.perf_counter() - started < 1.5  # ~0.3 s here; generous for a loaded CI box
        assert 1_800 <= len(workload.requests) <= 2_200


class TestSharedPrefix:
    def test_each_group_shares_its_system_prompt_and_nothing_else(self):
        workload = load_workload("shared-prefix-small")
        groups = defaultdict(list)
        for spec in workload.requests:
            groups[spec.req_id.split("-")[0]].append(spec.prompt_token_ids)
        assert len(groups) == 4 and all(len(prompts) == 8 for prompts in groups.values())
        system_prompts = {}
        for group, prompts in groups.items():
            shared = common_prefix_length(prompts)
            assert shared >= 64  # the definition draws system prompts of 64..112 tokens
            assert all(len(prompt) > shared for prompt in prompts)  # each has its own question
            system_prompts[group] = prompts[0][:shared]
        firsts = {tuple(prompt[:16]) for prompt in system_prompts.values()}
        assert len(firsts) == 4  # different groups differ from the first block on

    def test_groups_are_interleaved_in_arrival_order(self):
        workload = load_workload("shared-prefix")
        groups = [spec.req_id.split("-")[0] for spec in workload.requests]
        switches = sum(a != b for a, b in zip(groups, groups[1:]))
        assert switches > len(groups) // 2
        steps = [spec.arrival_step for spec in workload.requests]
        assert steps == sorted(steps)


def common_prefix_length(prompts):
    length = min(len(p) for p in prompts)
    for position in range(length):
        if len({p[position] for p in prompts}) > 1:
            return position
    return length


class TestMultiTurn:
    @pytest.mark.parametrize("name", ["multi-turn", "multi-turn-small"])
    def test_every_follow_up_prompt_extends_its_parents_full_history(self, name):
        workload = load_workload(name)
        specs = by_id(workload)
        for spec in workload.requests:
            if spec.parent is None:
                assert spec.turn == 0 and spec.think_steps == 0
                continue
            parent = specs[spec.parent]
            assert spec.conversation == parent.conversation and spec.turn == parent.turn + 1
            assert spec.prompt_token_ids[: len(history(parent))] == history(parent)
            assert len(spec.prompt_token_ids) > len(history(parent))  # plus a new user message

    def test_full_size_has_the_promised_shape(self):
        workload = load_workload("multi-turn")
        prompts = [spec.num_prompt_tokens for spec in workload.requests]
        assert 1_800 <= sum(prompts) / len(prompts) <= 2_800  # ~2k-token prompts
        assert workload.engine.scheduling == "async" and not workload.engine.offload_prompt_only
        length_capped = sum(spec.stop == "length" for spec in workload.requests)
        assert length_capped / len(workload.requests) > 0.8
        # All conversations open with one common prefix (vLLM's common_prefix_num_tokens).
        firsts = [tuple(spec.prompt_token_ids[:400]) for spec in workload.requests if spec.turn == 0]
        assert len(set(firsts)) == 1

    @pytest.mark.parametrize("name", ["multi-turn", "multi-turn-small", "spec-decode", "spec-decode-small"])
    def test_the_gpu_pool_cannot_hold_the_live_histories(self, name):
        # Halfway through the run, the conversations still alive hold more history than the
        # whole GPU pool, even before running requests take their share: earlier turns must
        # leave the GPU prefix cache, and only the CPU tier can serve them.
        workload = load_workload(name)
        steps = estimated_arrival_steps(workload.requests)
        midpoint = max(step + spec.max_tokens for step, spec in zip(steps, workload.requests)) // 2
        pool_tokens = workload.engine.gpu_blocks * workload.engine.block_size
        assert live_history_tokens(workload, midpoint) > pool_tokens


def live_history_tokens(workload, at_step):
    """Tokens of each conversation's latest arrived turn, over conversations not yet over, by
    the static arrival estimate (no queueing: real runs keep conversations alive longer)."""
    steps = estimated_arrival_steps(workload.requests)
    latest, ends = {}, defaultdict(int)
    for step, spec in zip(steps, workload.requests):
        ends[spec.conversation] = max(ends[spec.conversation], step + spec.max_tokens)
        if step <= at_step:
            latest[spec.conversation] = (spec, step)
    return sum(spec.num_prompt_tokens + min(spec.max_tokens, at_step - step)
               for conversation, (spec, step) in latest.items() if ends[conversation] >= at_step)


class TestSpecDecode:
    @pytest.mark.parametrize("name", ["spec-decode", "spec-decode-small"])
    def test_accept_counts_script_exactly_the_output(self, name):
        workload = load_workload(name)
        k = workload.engine.spec_tokens
        assert k == 3 and not workload.engine.offload_prompt_only
        for spec in workload.requests:
            assert all(0 <= a <= k for a in spec.accept_counts)
            # 1 token from the prefill step, then a + 1 per decode step.
            assert 1 + sum(a + 1 for a in spec.accept_counts) == spec.max_tokens

    @pytest.mark.parametrize("name", ["spec-decode", "spec-decode-small"])
    def test_half_the_requests_end_on_a_chunk_boundary_right_after_a_rejection(self, name):
        """The definition asks 50% (end_on_boundary = 0.5); a golden-ratio sequence spreads the
        classes so evenly that even 51 requests are within a few points of it, and requests of
        the free class can land there by chance. 0.45 leaves room for that rounding only."""
        workload = load_workload(name)
        on_chunk = [spec for spec in workload.requests if ends_on_chunk_after_rejection(spec, workload.engine)]
        assert len(on_chunk) / len(workload.requests) > 0.45
        chunk = workload.engine.tokens_per_chunk
        for spec in on_chunk:
            assert (spec.num_prompt_tokens + spec.max_tokens) % chunk == 0
            assert spec.accept_counts[-1] < workload.engine.spec_tokens
        # The other class: the final step completes the last chunk (total = multiple + 1).
        one_past = sum((s.num_prompt_tokens + s.max_tokens) % chunk == 1 for s in workload.requests)
        assert one_past / len(workload.requests) > 0.15

    def test_follow_ups_replay_the_histories_that_end_on_a_boundary(self):
        workload = load_workload("spec-decode")
        specs = by_id(workload)
        replayed = [specs[s.parent] for s in workload.requests if s.parent is not None]
        assert len(replayed) > len(workload.requests) // 3
        on_chunk_parents = [p for p in replayed if ends_on_chunk_after_rejection(p, workload.engine)]
        assert len(on_chunk_parents) > len(replayed) * 0.4
        for spec in workload.requests:
            if spec.parent is not None:
                assert spec.prompt_token_ids[: len(history(specs[spec.parent]))] == history(specs[spec.parent])

    def test_outputs_follow_the_chunk_size_after_an_override(self):
        workload = load_workload("spec-decode-small", {"blocks_per_chunk": "4"})
        assert workload.engine.tokens_per_chunk == 64
        on_chunk = sum(ends_on_chunk_after_rejection(spec, workload.engine) for spec in workload.requests)
        assert on_chunk / len(workload.requests) > 0.45

    def test_acceptance_follows_the_engine_setting(self):
        def mean_accepted(workload):
            counts = [a for spec in workload.requests for a in spec.accept_counts[:-1]]
            return sum(counts) / len(counts)

        low = load_workload("spec-decode", {"spec_acceptance": "0.3"})
        high = load_workload("spec-decode", {"spec_acceptance": "0.9"})
        # Leading successes of 3 Bernoulli(p): p + p^2 + p^3.
        assert mean_accepted(low) == pytest.approx(0.3 + 0.09 + 0.027, abs=0.05)
        assert mean_accepted(high) == pytest.approx(0.9 + 0.81 + 0.729, abs=0.1)

    def test_without_drafts_the_generator_refuses(self):
        from kvoffload.workloads import WorkloadError

        with pytest.raises(WorkloadError, match=r"spec-decode-small\.toml: key engine\.spec_tokens: expected"):
            load_workload("spec-decode-small", {"spec_tokens": "0"})


class TestDescribe:
    def test_summary_names_counts_and_the_reuse_ceiling(self):
        workload = load_workload("spec-decode-small")
        text = describe_workload(workload)
        assert text.splitlines()[0].startswith("spec-decode-small: ")
        assert f"requests        {len(workload.requests)} " in text
        assert f"prompt tokens   {sum(s.num_prompt_tokens for s in workload.requests):,} " in text
        assert "conversations   20, 2-3 turns" in text
        assert "end on a chunk boundary right after a rejection" in text
        assert f"{reusable_prompt_share(workload):.1%} of prompt tokens" in text
        assert "spec_tokens=3" in text

    def test_every_bundled_workload_has_room_for_a_cache(self):
        for name in BUNDLED:
            share = reusable_prompt_share(load_workload(name))
            assert 0.5 < share < 1.0, name

    def test_engine_config_is_a_real_engine_config(self):
        assert isinstance(load_workload("shared-prefix").engine, EngineConfig)
