"""Bad input: every problem is one WorkloadError line naming the file, the line or key, and what
was expected (the CLI prints it and exits 2; never a traceback)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvoffload.workloads import WorkloadError, load_workload

GOOD = """\
name = "tiny"
description = "a tiny multi-turn workload"
seed = 1

[engine]
gpu_blocks = 64
block_size = 16

[generator]
kind = "multi-turn"
conversations = 2
turns = 2
prefix_len = 8
user_len = 8
answer_len = 4
think_steps = 1
conversation_gap = 1
"""


def error_of(spec, overrides=None) -> str:
    with pytest.raises(WorkloadError) as caught:
        load_workload(spec, overrides)
    message = str(caught.value)
    assert "\n" not in message and message == message.strip()
    return message


@pytest.fixture
def definition(tmp_path, monkeypatch):
    """Write GOOD with one edit to tiny.toml; return the path as the user typed it (relative)."""
    monkeypatch.chdir(tmp_path)

    def write(old: str = "", new: str = "") -> str:
        assert old in GOOD
        Path("tiny.toml").write_text(GOOD.replace(old, new, 1))
        return "tiny.toml"

    return write


def test_the_good_definition_loads(definition):
    assert len(load_workload(definition()).requests) == 4


class TestDefinitionFiles:
    def test_malformed_toml_names_the_line_and_column(self, definition):
        spec = definition("seed = 1", "seed = = 1")
        assert error_of(spec).startswith("tiny.toml: line 3, column 8: expected valid TOML, got: ")

    def test_unknown_keys_are_errors_everywhere(self, definition):
        assert error_of(definition("seed = 1", "seed = 1\ncolour = 'red'")).startswith(
            "tiny.toml: key colour: unknown key (expected one of: description, engine, generator, name, seed)")
        assert error_of(definition("conversations = 2", "conversations = 2\nturn = 3")).startswith(
            "tiny.toml: key generator.turn: unknown key (expected one of: ")
        assert error_of(definition("gpu_blocks = 64", "gpu_blocks = 64\ngpu_memory = 3")).startswith(
            "tiny.toml: key engine.gpu_memory: expected an engine setting (gpu_blocks, cpu_chunks, ")

    def test_negative_length(self, definition):
        assert error_of(definition("answer_len = 4", "answer_len = -4")) == (
            "tiny.toml: key generator.answer_len: expected an integer >= 1 or a distribution table, got -4")

    def test_wrong_types_and_values(self, definition):
        assert error_of(definition("turns = 2", "turns = 'two'")).startswith(
            "tiny.toml: key generator.turns: expected an integer >= 1 or a distribution table")
        assert error_of(definition("gpu_blocks = 64", "gpu_blocks = '64'")) == (
            "tiny.toml: key engine.gpu_blocks: expected an integer, got '64'")
        assert error_of(definition("gpu_blocks = 64", "gpu_blocks = 1")) == (
            "tiny.toml: key engine: gpu_blocks must be at least 2 (block 0 is the null block), got 1")
        assert error_of(definition("block_size = 16", "scheduling = 'eager'")) == (
            "tiny.toml: key engine.scheduling: expected one of 'sync', 'async', got 'eager'")
        assert error_of(definition('kind = "multi-turn"', 'kind = "chat"')).startswith(
            "tiny.toml: key generator.kind: expected one of 'mooncake', 'multi-turn', ")

    def test_missing_required_keys(self, definition):
        assert error_of(definition("seed = 1\n")) == "tiny.toml: key seed: required key is missing"
        assert error_of(definition("conversations = 2\n")) == (
            "tiny.toml: key generator.conversations: required key is missing")

    def test_the_engine_seed_is_the_top_level_seed(self, definition):
        assert error_of(definition("block_size = 16", "seed = 3")).startswith("tiny.toml: key engine.seed: expected")

    def test_missing_file_and_unknown_name(self, tmp_path):
        assert error_of(str(tmp_path / "none.toml")) == (
            f"{tmp_path / 'none.toml'}: no such file (expected a workload definition .toml)")
        message = error_of("multi-tern")
        assert message.startswith("multi-tern: unknown workload (expected a bundled name (aborts-and-resets, ")
        assert "mooncake:FILE or sharegpt:FILE" in message


class TestOverrides:
    def test_unknown_setting(self):
        assert error_of("multi-turn-small", {"gpu_memory": "3"}).startswith(
            "--set gpu_memory=3: unknown setting 'gpu_memory' (known: ")

    def test_bad_value(self):
        assert error_of("multi-turn-small", {"gpu_blocks": "many"}) == (
            "--set gpu_blocks=many: gpu_blocks expects an integer, got 'many'")
        assert error_of("multi-turn-small", {"gpu_blocks": "-3"}) == (
            "--set gpu_blocks=-3: gpu_blocks must be an integer >= 1, got -3")


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


GOOD_LINE = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]})


class TestMooncakeTraces:
    def test_a_truncated_line(self, tmp_path):
        trace = write_lines(tmp_path / "t.jsonl", [GOOD_LINE, GOOD_LINE[:30]])
        assert error_of(f"mooncake:{trace}").startswith(
            f"{trace}: line 2: expected a JSON object, got invalid JSON (Unterminated string")

    def test_a_line_that_is_not_json(self, tmp_path):
        trace = write_lines(tmp_path / "t.jsonl", [GOOD_LINE, "", "timestamp=3"])
        assert error_of(f"mooncake:{trace}") == (
            f"{trace}: line 3: expected a JSON object, got invalid JSON (Expecting value at column 1)")

    @pytest.mark.parametrize("change, expected", [
        ({"input_length": -5}, "line 1: key input_length: expected an integer >= 1, got -5"),
        ({"output_length": 0}, "line 1: key output_length: expected an integer >= 1, got 0"),
        ({"timestamp": "noon"}, "line 1: key timestamp: expected finite milliseconds within [0, 2**53], got 'noon'"),
        ({"hash_ids": [1]}, "line 1: key hash_ids: expected ceil(input_length / 512) = 2 ids, got 1"),
        ({"hash_ids": "1,2"}, "line 1: key hash_ids: expected a list of integers, got '1,2'"),
    ])
    def test_bad_fields(self, tmp_path, change, expected):
        record = {**json.loads(GOOD_LINE), **change}
        trace = write_lines(tmp_path / "t.jsonl", [json.dumps(record)])
        assert error_of(f"mooncake:{trace}") == f"{trace}: {expected}"

    def test_a_missing_key_and_an_empty_trace(self, tmp_path):
        trace = write_lines(tmp_path / "t.jsonl", [json.dumps({"timestamp": 0, "input_length": 3})])
        assert error_of(f"mooncake:{trace}") == (
            f"{trace}: line 1: expected keys timestamp, input_length, output_length and hash_ids, "
            "got no 'output_length'")
        empty = write_lines(tmp_path / "e.jsonl", [])
        assert error_of(f"mooncake:{empty}") == f"{empty}: expected at least one JSON line, got an empty trace"

    def test_a_number_too_long_to_read_is_named_at_its_line_once(self, tmp_path):
        # The line is in the message's prefix; the number's description must not add a line of
        # its own, counted within the one line it was given (it would say "at line 1" here).
        record = json.loads(GOOD_LINE)
        line = json.dumps(record).replace('"input_length": 600', '"input_length": ' + "7" * 5_000)
        trace = write_lines(tmp_path / "t.jsonl", [GOOD_LINE, line])
        assert error_of(f"mooncake:{trace}") == (
            f"{trace}: line 2: expected integers of at most 4,300 digits, got an integer of 5,000 digits")

    def test_a_missing_trace_file(self, tmp_path):
        missing = tmp_path / "gone.jsonl"
        assert error_of(f"mooncake:{missing}") == f"{missing}: no such file (expected a Mooncake JSONL trace)"


class TestShareGPTFiles:
    def test_a_conversation_with_no_turns(self, tmp_path):
        data = tmp_path / "c.json"
        data.write_text(json.dumps([
            {"id": "ok", "conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
            {"id": "empty", "conversations": []},
        ]))
        assert error_of(f"sharegpt:{data}") == (
            f"{data}: record 2 (id 'empty'): expected at least one human message followed by a gpt answer, "
            "got none (0 messages)")

    def test_an_unknown_role(self, tmp_path):
        data = tmp_path / "c.json"
        data.write_text(json.dumps([{"id": "r", "conversations": [{"from": "narrator", "value": "once"}]}]))
        assert error_of(f"sharegpt:{data}").startswith(
            f"{data}: record 1 (id 'r'): key conversations[0].from: expected one of assistant, bard, ")

    def test_truncated_json(self, tmp_path):
        data = tmp_path / "c.json"
        data.write_text('[\n  {"id": "a", "conversations": [{"from": "human", "value": "hi"}\n')
        assert error_of(f"sharegpt:{data}").startswith(f"{data}: line 3: expected valid JSON, got invalid JSON (")

    def test_a_bad_jsonl_line(self, tmp_path):
        data = tmp_path / "c.jsonl"
        good = json.dumps({"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                                        {"from": "gpt", "value": "x"}]})
        data.write_text(good + "\n" + good[:25] + "\n")
        assert error_of(f"sharegpt:{data}").startswith(
            f"{data}: line 2: expected one JSON record per line, got invalid JSON (")

    def test_a_missing_file(self, tmp_path):
        missing = tmp_path / "gone.json"
        assert error_of(f"sharegpt:{missing}") == f"{missing}: no such file (expected a ShareGPT JSON file)"

    def test_datasets_runs_offline(self, tmp_path):
        data = tmp_path / "c.json"
        messages = [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]
        data.write_text(json.dumps([{"conversations": messages}]))
        load_workload(f"sharegpt:{data}")
        assert os.environ["HF_DATASETS_OFFLINE"] == "1" and os.environ["HF_HUB_OFFLINE"] == "1"
