"""The optional [resets] table: vLLM's ``reset_prefix_cache(reset_connector=True)`` at chosen
engine steps (an operator's POST /reset_prefix_cache), replayed by the engines, and the bundled
workload that holds every situation the last four fix flags guard."""

from __future__ import annotations

import pytest

from kvoffload.choice import ConnectorChoice
from kvoffload.runner import replay_workload
from kvoffload.workloads import WorkloadError, load_workload

DEFINITION = """
name = "resetting"
description = "short conversations, the caches reset twice"
seed = 3

[engine]
block_size = 4
store_completion_steps = 3

[generator]
kind = "multi-turn"
conversations = 4
turns = 3
prefix_len = 24
user_len = 4
answer_len = 8
think_steps = 2
conversation_gap = 1
"""


def write(tmp_path, text):
    path = tmp_path / "w.toml"
    path.write_text(text)
    return str(path)


def test_resets_are_read_and_change_nothing_else(tmp_path):
    plain = load_workload(write(tmp_path, DEFINITION))
    resetting = load_workload(write(tmp_path, DEFINITION + "\n[resets]\nat_steps = [5, 12]\n"))
    assert resetting.reset_cache_at == (5, 12) and plain.reset_cache_at == ()
    assert resetting.requests == plain.requests and resetting.engine == plain.engine


def test_the_simulator_resets_at_those_steps(tmp_path):
    """The run record lists each scripted reset with vLLM's answer (refused while GPU blocks
    are in use; the connector's cache is reset either way: docs/engine.md)."""
    workload = load_workload(write(tmp_path, DEFINITION + "\n[resets]\nat_steps = [5, 12]\n"))
    outcome = replay_workload(workload, ConnectorChoice.build())
    assert [step for step, _ in outcome.record.resets] == [5, 12]
    plain = replay_workload(load_workload(write(tmp_path, DEFINITION)), ConnectorChoice.build())
    assert plain.record.resets == [] and plain.result["metrics"] != outcome.result["metrics"]


@pytest.mark.parametrize("table, message", [
    ("at_steps = []", "resets.at_steps: expected an increasing list"),
    ("at_steps = [5, 5]", "resets.at_steps: expected an increasing list"),
    ("at_steps = [0]", "resets.at_steps: expected an increasing list"),
    ("at_steps = 5", "resets.at_steps: expected an increasing list"),
    ("at_steps = [1.5]", "resets.at_steps: expected an increasing list"),
    ("at_steps = [3]\nevery = 2", "resets.every"),
    ("every = 2", "resets.at_steps"),
])
def test_bad_reset_tables_are_named(tmp_path, table, message):
    with pytest.raises(WorkloadError, match=message):
        load_workload(write(tmp_path, DEFINITION + "\n[resets]\n" + table + "\n"))


@pytest.mark.parametrize("name", ["aborts-and-resets", "aborts-and-resets-small"])
def test_the_bundled_workload_holds_every_situation_it_is_for(name):
    """Queued aborts (at the step a request arrives), aborts 1-3 steps in, which a 60-token step
    budget leaves mid-prefill with a half-written block (one block per chunk, so a follow-up
    loads exactly that block), stores that take 8 steps (so preemption and resets meet them in
    flight), async scheduling, and resets inside the run."""
    workload = load_workload(name)
    engine = workload.engine
    delays = [spec.abort_after_steps for spec in workload.requests if spec.abort_after_steps is not None]
    assert 0 in delays and any(1 <= delay <= 3 for delay in delays)
    assert engine.max_num_batched_tokens % engine.block_size and engine.blocks_per_chunk == 1
    assert all(spec.num_prompt_tokens > engine.max_num_batched_tokens for spec in workload.requests)  # 2+ steps
    assert engine.scheduling == "async" and engine.store_completion_steps == 8
    assert len(workload.reset_cache_at) >= 2


def test_a_reset_list_as_long_as_usage_md_allows_is_read_and_one_step_more_refused(tmp_path):
    """docs/usage.md ("Exit codes and bad input") bounds a hand-written [resets] list: a list of
    that many steps is read, one of a step more is refused in one line naming the bound."""
    import re
    from pathlib import Path

    usage = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    (bound,) = re.findall(r"at most ([\d,]+) scripted cache resets", usage.replace("\n  ", " "))
    most = int(bound.replace(",", ""))
    workload = load_workload(write(tmp_path, DEFINITION + f"\n[resets]\nat_steps = {list(range(1, most + 1))}\n"))
    assert len(workload.reset_cache_at) == most
    with pytest.raises(WorkloadError, match=f"resets.at_steps: expected an increasing list of at most {bound} "):
        load_workload(write(tmp_path, DEFINITION + f"\n[resets]\nat_steps = {list(range(1, most + 2))}\n"))
