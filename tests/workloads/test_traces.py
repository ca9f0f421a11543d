"""Trace loaders: Mooncake JSONL (hash-id blocks) and ShareGPT conversations (through datasets)."""

from __future__ import annotations

import json
from pathlib import Path


from kvoffload.workloads import DEFAULT_WORKLOAD, load_workload, reusable_prompt_share
from kvoffload.workloads.tokens import ASSISTANT_ID, EOS_ID, USER_ID, StandInTokenizer

SAMPLES = Path(__file__).resolve().parents[2] / "workloads" / "samples"


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def mooncake_line(timestamp, input_length, output_length, hash_ids):
    return {"timestamp": timestamp, "input_length": input_length, "output_length": output_length,
            "hash_ids": hash_ids}


class TestMooncake:
    def test_equal_hash_ids_give_equal_token_blocks(self, tmp_path):
        trace = write_jsonl(tmp_path / "t.jsonl", [
            mooncake_line(0, 1100, 20, [1, 2, 3]),     # blocks 1, 2 and 88 tokens of 3
            mooncake_line(40, 1500, 30, [1, 2, 4]),    # shares blocks 1 and 2
            mooncake_line(100, 300, 10, [3]),          # block 3 again, cut to 300 tokens
        ])
        a, b, c = load_workload(f"mooncake:{trace}").requests
        assert (a.num_prompt_tokens, b.num_prompt_tokens, c.num_prompt_tokens) == (1100, 1500, 300)
        assert a.prompt_token_ids[:1024] == b.prompt_token_ids[:1024]
        assert a.prompt_token_ids[1024:1030] != b.prompt_token_ids[1024:1030]  # ids 3 and 4 differ
        # The same id at another position is the same 512 tokens, cut to what input_length leaves.
        assert c.prompt_token_ids[:76] == a.prompt_token_ids[1024:1100]
        assert (a.max_tokens, b.max_tokens, c.max_tokens) == (20, 30, 10)
        assert {a.stop, b.stop, c.stop} == {"length"}

    def test_timestamps_become_arrival_steps_from_the_first(self, tmp_path):
        trace = write_jsonl(tmp_path / "t.jsonl", [
            mooncake_line(1000, 10, 5, [7]),
            mooncake_line(1059, 10, 5, [7]),
            mooncake_line(3000, 10, 5, [8]),
        ])
        requests = load_workload(f"mooncake:{trace}").requests
        # 20 ms per engine step by default: (t - 1000) / 20, rounded.
        assert [spec.arrival_step for spec in requests] == [0, 3, 100]

    def test_a_definition_can_set_the_step_length_and_a_limit(self, tmp_path):
        write_jsonl(tmp_path / "t.jsonl", [mooncake_line(t, 10, 5, [t]) for t in range(0, 1000, 100)])
        (tmp_path / "m.toml").write_text(
            'name = "m"\ndescription = "d"\nseed = 1\n[engine]\nblock_size = 16\n'
            '[generator]\nkind = "mooncake"\npath = "t.jsonl"\nms_per_step = 50\nmax_requests = 4\n'
        )
        workload = load_workload(str(tmp_path / "m.toml"))  # path relative to the definition
        assert [spec.arrival_step for spec in workload.requests] == [0, 2, 4, 6]

    def test_engine_settings_come_from_the_default_workload_and_yield_to_overrides(self):
        default = load_workload(DEFAULT_WORKLOAD)
        trace = load_workload(f"mooncake:{SAMPLES / 'mooncake-sample.jsonl'}", {"cpu_chunks": "64"})
        assert trace.engine == default.engine.replace(cpu_chunks=64)
        assert trace.seed == default.seed

    def test_the_bundled_sample_repeats_prefixes(self):
        workload = load_workload(f"mooncake:{SAMPLES / 'mooncake-sample.jsonl'}")
        assert len(workload.requests) == 20
        assert reusable_prompt_share(workload) > 0.5


def write_sharegpt(path: Path, records) -> Path:
    path.write_text(json.dumps(records))
    return path


def turn(role, text):
    return {"from": role, "value": text}


class TestShareGPT:
    def test_a_conversation_becomes_a_follow_up_chain(self, tmp_path):
        data = write_sharegpt(tmp_path / "c.json", [{"id": "x", "conversations": [
            turn("human", "what is a block?"), turn("gpt", "sixteen tokens."),
            turn("human", "and a chunk?"), turn("gpt", "several blocks."),
        ]}])
        first, second = load_workload(f"sharegpt:{data}").requests
        encode = StandInTokenizer().encode
        assert first.prompt_token_ids == (USER_ID, *encode("what is a block?"), ASSISTANT_ID)
        assert first.output_token_ids == (*encode("sixteen tokens."), EOS_ID) and first.stop == "eos"
        # Turn 2 = turn 1's prompt + answer + the new user message.
        assert second.parent == first.req_id and second.conversation == first.conversation
        assert second.prompt_token_ids == (first.prompt_token_ids + first.output_token_ids
                                           + (USER_ID, *encode("and a chunk?"), ASSISTANT_ID))
        assert second.think_steps >= 0 and second.turn == 1

    def test_the_stand_in_tokenizer_is_deterministic_and_roughly_bpe_sized(self):
        text = "The quick brown fox jumps over the lazy dog, twice."
        ids = StandInTokenizer().encode(text)
        assert ids == StandInTokenizer().encode(text)
        assert StandInTokenizer().encode("the dog")[0] == StandInTokenizer().encode("the cat")[0]
        assert len(text) / 6 < len(ids) < len(text) / 2

    def test_messy_records_are_normalised(self, tmp_path):
        data = write_sharegpt(tmp_path / "c.json", [
            {"id": "sys", "conversations": [turn("system", "be brief"), turn("human", "hi"), turn("gpt", "hello")]},
            {"id": "mid", "conversations": [turn("gpt", "...as I said."), turn("human", "ok"),
                                             turn("human", "and?"), turn("gpt", "done"), turn("human", "bye")]},
        ])
        requests = load_workload(f"sharegpt:{data}").requests
        encode = StandInTokenizer().encode
        assert len(requests) == 2  # the leading answer and the unanswered "bye" are dropped
        system_first = next(spec for spec in requests if spec.req_id.startswith("sg1"))
        assert system_first.prompt_token_ids[: len(encode("be brief"))] == encode("be brief")
        joined = next(spec for spec in requests if spec.req_id.startswith("sg2"))
        assert joined.prompt_token_ids == (USER_ID, *encode("ok\nand?"), ASSISTANT_ID)

    def test_jsonl_works_too(self, tmp_path):
        data = write_jsonl(tmp_path / "c.jsonl", [
            {"id": str(i), "conversations": [turn("human", f"question {i}"), turn("gpt", "answer")]}
            for i in range(3)
        ])
        requests = load_workload(f"sharegpt:{data}").requests
        assert len(requests) == 3 and all(spec.parent is None for spec in requests)
        assert [spec.arrival_step for spec in requests] == sorted(spec.arrival_step for spec in requests)

    def test_the_bundled_sample(self):
        workload = load_workload(f"sharegpt:{SAMPLES / 'sharegpt-sample.json'}")
        conversations = {spec.conversation for spec in workload.requests}
        assert len(conversations) == 5
        assert len(workload.requests) == 9  # 3 + 2 + 1 + 2 + 1 answered turns
        assert load_workload(f"sharegpt:{SAMPLES / 'sharegpt-sample.json'}") == workload
