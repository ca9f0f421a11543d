"""vLLM's ExampleConnector and composed connectors (MultiConnector) in vLLM's scheduler: the
disk connector's files stay in the run's folder, its synchronous loads are checked by the
content oracle, its own bug (a hit whose file was never written) is a crash verdict; the
composition serves through its offloading part."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from kvoffload.engine.requests import RequestSpec  # noqa: E402
from kvoffload.gates.plugin import GateConnector  # noqa: E402
from kvoffload.gates.story import TINY, follow_up, replay, tokens  # noqa: E402


def test_examples_synchronous_loads_are_checked():
    a = RequestSpec("A", tokens(1, 10), tokens(2, 2))
    b = RequestSpec("B", tokens(1, 10), tokens(3, 2), arrival_step=5)
    record, built = replay(GateConnector("example", None), [a, b], forget_gpu_cache_before=(4, 5))
    assert (record.crash, record.poisoned) == (None, [])
    assert record.connector_hit_tokens_admitted == built.checked_load_tokens == 8


def test_a_hit_whose_file_was_never_written_is_examples_crash():
    """ExampleConnector keys its lookup by prompt[:align(len - 1)] and its load by
    prompt[:align(len)]: one token more than a stored prompt hits and finds no file."""
    a = RequestSpec("A", tokens(1, 8), tokens(2, 2))
    b = RequestSpec("B", tokens(1, 9), tokens(3, 2), arrival_step=5)
    record, _ = replay(GateConnector("example", None), [a, b], forget_gpu_cache_before=(4, 5))
    assert record.crash_type == "FileNotFoundError"
    assert "example_connector.py" in record.crash_frames[0] and "in start_load_kv" in record.crash_frames[0]


def test_the_stock_connector_serves_inside_a_multiconnector():
    a = RequestSpec("A", tokens(1, 8), tokens(2, 1))
    record, built = replay(GateConnector("stock+example", None), [a, follow_up(a)], forget_gpu_cache_before=(2,))
    assert type(built.scheduler.connector).__name__ == "MultiConnector"
    assert (record.crash, record.poisoned, record.leaked_requests) == (None, [], ())
    assert record.connector_hit_tokens_admitted == built.checked_load_tokens == 8


def test_a_connector_without_hma_gets_one_full_attention_group_on_a_hybrid_model():
    """vLLM turns its hybrid KV cache manager off for a connector that is not SupportsHMA and
    promotes the window layer to full attention: one group of both layers (``VllmConfig``,
    ``unify_hybrid_kv_cache_specs``); its scheduler asserts that group at every finish
    (``Scheduler._connector_finished``). With the model's two groups, ExampleConnector and
    ``stock+example`` crashed at A's finish; vLLM's stock connector (HMA) keeps both."""
    a = RequestSpec("A", tokens(1, 16), tokens(2, 4))
    c = RequestSpec("C", tokens(1, 16) + tokens(5, 4), tokens(6, 2), arrival_step=20)
    hybrid = TINY.replace(model="gpt-oss-tiny", gpu_blocks=13, scheduling="sync")
    groups = {}
    for source in ("example", "stock+example", "stock"):
        record, built = replay(GateConnector(source, None), [a, c], hybrid, forget_gpu_cache_before=(20,))
        assert (record.crash, record.poisoned, record.finished_requests) == (None, [], 2), source
        groups[source] = [(type(g.kv_cache_spec).__name__, len(g.layer_names))
                          for g in built.scheduler.kv_cache_config.kv_cache_groups]
        if source == "stock+example":  # the stock part serves C's 16 tokens from one group
            assert record.connector_hit_tokens_admitted == built.checked_load_tokens == 16
    assert groups == {"example": [("FullAttentionSpec", 2)], "stock+example": [("FullAttentionSpec", 2)],
                      "stock": [("FullAttentionSpec", 1), ("SlidingWindowSpec", 1)]}


def test_run_keeps_examples_files_beside_the_result(monkeypatch, tmp_path, capsys):
    """Never in the repository or the working directory: ``<result>.kv-store/``, emptied by the
    next run of the same result (its mark says it is a store)."""
    from kvoffload.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs" / "example.json"
    for _ in range(2):
        code = main(["run", "--engine", "vllm-scheduler", "--connector", "example", "--workload",
                     "shared-prefix-small", "--set", "offload_prompt_only=false", "--quiet", "--out", str(out)])
        capsys.readouterr()
        assert code == 0
    store = tmp_path / "runs" / "example.kv-store"
    assert any(path.suffix == ".safetensors" for path in store.rglob("*"))
    assert json.loads(out.read_text())["connector"]["storage_dir"] == str(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    (store / ".kvoffload-kv-store").unlink()  # no longer a store of ours: refused, in one line
    assert main(["run", "--engine", "vllm-scheduler", "--connector", "example", "--workload", "shared-prefix-small",
                 "--quiet", "--out", str(out)]) == 2


def test_the_command_lines_foreign_names_are_the_families():
    """choice.FOREIGN (the names the CLI and the plugin accept, no vLLM import) and
    foreign.FAMILIES (how each is built) list the same connectors."""
    from kvoffload.choice import FOREIGN
    from kvoffload.vllm.foreign import FAMILIES

    assert set(FOREIGN) == set(FAMILIES)
