"""The simulator against vLLM's scheduler: same workload, same (reference) connector.

Per request: the first admission's GPU prefix-cache hit and connector hit, the chunks stored and
the chunks loaded; per step: the tokens scheduled for each request (drafts included) and the free
GPU blocks after the schedule, which must be equal in every step. The target is agreement on >= 99 % of requests. Measured on 2026-12-01: every
request agrees on every small workload, sync and async, spec-decode-small included (it agreed on
49 of 51 before the engine reserved one decode step's blocks for a load under speculative
decoding, vLLM's ``_spec_decode_step_blocks``). The test asserts the measured agreement as a
floor (an engine change that loses agreement fails) and prints the table; ``-s`` shows it, in
the markdown of docs/fidelity.md's differential table. The full workloads run on request
(``KVOFFLOAD_DIFFERENTIAL_FULL=1``; seconds to minutes each).

Every comparison runs under the pinned string hash seed (``kvoffload.vllm.pinned``): with a full
CPU tier, the order in which vLLM walks a step's finished requests (a ``set[str]``) decides what
is evicted, and the simulator follows that order for the pinned seed (docs/fidelity.md, "finish
order"). The rows with ``cpu_chunks=32`` are that repro; there vLLM's own connector must also
agree with both on every request's admission. So must it on every hybrid model's row (``gpt-oss``:
full attention and a sliding window, docs/engine.md "Hybrid models"), where it checks the
reference connector's per-group rules against vLLM's; ``qwen3-next`` (full attention and Mamba)
rows too.
"""

from __future__ import annotations

from collections import Counter

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

sys.path.insert(0, str(Path(__file__).parent))  # differential.py: the child interpreter imports it by name
sys.path[1:1] = [str(Path(__file__).parents[1] / "engine"), str(Path(__file__).parents[1] / "gates")]  # readmitted.py

from differential import compare, compare_opted_in, store_delays  # noqa: E402
from readmitted import READMITTED, readmitted_requests  # noqa: E402

from kvoffload.engine.set_order import HASH_SEED  # noqa: E402
from kvoffload.metrics import MEASURED_METRICS  # noqa: E402
from kvoffload.vllm.compat import RELEASE  # noqa: E402
from kvoffload.vllm.pinned import call_pinned  # noqa: E402

TARGET = 0.99
# (workload, scheduling) -> requests agreeing on all four quantities, measured (see docstring)
AGREEING_TODAY = {
    ("shared-prefix-small", "sync"): 32,  # of 32
    ("shared-prefix-small", "async"): 32,
    ("multi-turn-small", "sync"): 53,  # of 53
    ("multi-turn-small", "async"): 53,
    ("spec-decode-small", "sync"): 51,  # of 51
    ("spec-decode-small", "async"): 51,  # of 51
    # The same with a third of the GPU blocks: preemptions, resumed requests, padded decode steps.
    ("spec-decode-small gpu_blocks=24", "sync"): 51,  # of 51
    ("spec-decode-small gpu_blocks=24", "async"): 51,
    # The finish-order repro: a CPU tier of 32 chunks evicts while several requests finish in one
    # step. vLLM's own connector gives 640 (sync) and 624 (async) connector-hit tokens here under
    # PYTHONHASHSEED=0, 640 or 816 and 624, 656 or 848 under other seeds.
    ("multi-turn-small cpu_chunks=32", "sync"): 53,  # of 53
    ("multi-turn-small cpu_chunks=32", "async"): 53,
    # vLLM's scheduler_reserve_full_isl off (admit on the first chunk's blocks), GPU blocks scarce.
    ("spec-decode-small gpu_blocks=24 reserve_full_isl=false", "sync"): 51,  # of 51
    ("spec-decode-small gpu_blocks=24 reserve_full_isl=false", "async"): 51,
    # queued and mid-prefill aborts, preemption with stores in flight, two cache resets
    ("aborts-and-resets-small", "async"): 43,  # of 43
    # Hybrid models (docs/engine.md, "Hybrid models"): full attention and a 128-token sliding
    # window. Here vLLM's own connector must also admit every request as ours does (HYBRID_ROWS).
    ("gpt-oss-multi-turn-small", "sync"): 53,  # of 53
    ("gpt-oss-multi-turn-small", "async"): 53,
    ("gpt-oss-spec-decode-small", "sync"): 51,  # of 51
    ("gpt-oss-spec-decode-small", "async"): 51,
    ("gpt-oss-spec-decode-small gpu_blocks=40", "sync"): 51,  # of 51; 21 preemptions
    ("gpt-oss-spec-decode-small gpu_blocks=40", "async"): 51,
    ("gpt-oss-multi-turn-small cpu_chunks=32", "sync"): 53,  # of 53
    ("gpt-oss-multi-turn-small prefix_cache_retention_interval=dense", "async"): 53,  # of 53
    # Full attention and Mamba in align mode (qwen3-next): one state block per request, the
    # block-aligned split, the rightmost cached state, the boundary-state hand-off to the
    # connector. A budget of 40 (not a multiple of the block) and 30 GPU blocks (preemptions)
    # reach the split's stops and the same-step rules (docs/engine.md, "Hybrid models").
    ("multi-turn-small model=qwen3-next", "sync"): 53,  # of 53
    ("multi-turn-small model=qwen3-next", "async"): 53,
    ("multi-turn-small model=qwen3-next gpu_blocks=30", "sync"): 53,  # of 53; 6 preemptions
    ("multi-turn-small model=qwen3-next gpu_blocks=30", "async"): 53,  # 4 preemptions
    ("shared-prefix-small model=qwen3-next", "sync"): 32,  # of 32; 13 preemptions
    ("shared-prefix-small model=qwen3-next max_num_batched_tokens=40", "sync"): 32,  # of 32
    ("shared-prefix-small model=qwen3-next max_num_batched_tokens=40", "async"): 32,
    ("multi-turn-small model=qwen3-next prefix_cache_retention_interval=dense", "async"): 53,  # of 53
    ("multi-turn-small model=qwen3-next prefix_cache_retention_interval=64", "async"): 53,  # of 53
    ("aborts-and-resets-small model=qwen3-next", "async"): 43,  # of 43
    # Speculative decoding with a Mamba group: a state block per draft token in the row, and the
    # state at a boundary accepted drafts reached (docs/engine.md, "Hybrid models"). Dense
    # retention caches those states; 40 GPU blocks preempt.
    ("qwen3-next-spec-decode-small", "sync"): 51,  # of 51
    ("qwen3-next-spec-decode-small", "async"): 51,
    ("qwen3-next-spec-decode-small gpu_blocks=40", "sync"): 51,  # of 51; 32 preemptions
    ("qwen3-next-spec-decode-small gpu_blocks=40", "async"): 51,  # 23 preemptions
    ("qwen3-next-spec-decode-small prefix_cache_retention_interval=dense", "sync"): 51,  # of 51
    ("qwen3-next-spec-decode-small prefix_cache_retention_interval=dense", "async"): 51,
}
AGREEING_TODAY_FULL = {
    ("spec-decode", "sync"): 388,  # of 388
    ("spec-decode", "async"): 388,
    ("gpt-oss-spec-decode", "sync"): 388,  # of 388
    ("gpt-oss-spec-decode", "async"): 388,
    ("qwen3-next-multi-turn", "sync"): 2016,  # of 2016; vLLM's own connector admits all 2013 alike
    ("qwen3-next-multi-turn", "async"): 2016,
    ("qwen3-next-spec-decode", "sync"): 388,  # of 388
    ("qwen3-next-spec-decode", "async"): 388,
}
# The repro's connector-hit tokens, the same for the simulator, our connector and vLLM's (seed 0).
FINISH_ORDER_REPRO = {("multi-turn-small cpu_chunks=32", "sync"): 640,
                      ("multi-turn-small cpu_chunks=32", "async"): 624}
# Chunks whose store submission delay the two observers count differently
# (docs/fidelity.md, "Store delays on aborts-and-resets"): aborts-and-resets-small's 43 chunks
# are 1 step in the simulator and 32 or 44 steps on vLLM's side; every request and step agrees.
DELAYS_APART = {("aborts-and-resets-small", "async"): 43,
                # the same observer difference on qwen3-next: 53 chunks 1 step here, 9 or 19 there
                ("aborts-and-resets-small model=qwen3-next", "async"): 53,
                # s09-t00's Mamba chunk 0: 3 steps here, 1 there (its block handed to s11-t00 at step 55)
                ("qwen3-next-spec-decode-small prefix_cache_retention_interval=dense", "async"): 1}
FULL = os.environ.get("KVOFFLOAD_DIFFERENTIAL_FULL") == "1"
_table: list[str] = []
# Left out of CI to keep its vLLM stage within its time (scripts/vllm-on-demand runs them): the
# finish-order repro keeps its sync row in CI.
ON_DEMAND_ROWS = {("multi-turn-small cpu_chunks=32", "async"),
                  ("spec-decode-small gpu_blocks=24 reserve_full_isl=false", "sync"),
                  ("spec-decode-small gpu_blocks=24 reserve_full_isl=false", "async"),
                  ("aborts-and-resets-small", "async"),
                  *((name, scheduling) for name, scheduling in AGREEING_TODAY if name.startswith("gpt-oss")
                    and (name, scheduling) not in {("gpt-oss-multi-turn-small", "async"),
                                                   ("gpt-oss-spec-decode-small", "sync")}),
                  *((name, scheduling) for name, scheduling in AGREEING_TODAY if "qwen3-next" in name
                    and (name, scheduling) not in {("multi-turn-small model=qwen3-next", "async"),
                                                   ("qwen3-next-spec-decode-small", "sync")})}
ROWS = [pytest.param(name, scheduling, marks=(pytest.mark.vllm_on_demand,) if (name, scheduling) in ON_DEMAND_ROWS
                     else () if (name, scheduling) in AGREEING_TODAY else pytest.mark.skipif(
    not FULL, reason="full workloads: KVOFFLOAD_DIFFERENTIAL_FULL=1")) for name, scheduling in
    [*AGREEING_TODAY, *AGREEING_TODAY_FULL]]


@pytest.mark.parametrize("name, scheduling", ROWS)
def test_simulator_and_vllm_scheduler_agree_per_request(name, scheduling):
    base, *settings = name.split()  # "NAME key=value ...": engine settings changed
    repro = FINISH_ORDER_REPRO.get((name, scheduling))
    hybrid = base.startswith(("gpt-oss", "qwen3-next")) or "model=qwen3-next" in settings
    ids, sim, real, stock = call_pinned(compare, base, scheduling, dict(kv.split("=") for kv in settings),
                                        repro is not None or hybrid)
    assert sim.crash is None and real.crash is None
    # Store submission delays, measured at each engine's own point (observer / transfer handler):
    # the same distribution, chunk for chunk; where the two observers are known to date some
    # chunks differently (docs/fidelity.md), exactly that many chunks differ.
    apart = sum((Counter(sim.store_submit_delays) - Counter(real.store_submit_delays)).values())
    assert apart == DELAYS_APART.get((name, scheduling), 0), (apart, sim.store_submit_delays[-5:])

    agreeing = sum(sim.per_request[r] == real.per_request[r] for r in ids)
    _table.append(table_row(name, scheduling, sim.totals, real.totals, agreeing, len(ids)))
    print("\n" + _table[-1])
    floor = {**AGREEING_TODAY, **AGREEING_TODAY_FULL}[(name, scheduling)]
    assert agreeing >= floor, (
        f"agreement fell to {agreeing}/{len(ids)} (was {floor}); first differences: "
        f"{[(r, sim.per_request[r], real.per_request[r]) for r in ids if sim.per_request[r] != real.per_request[r]][:3]}")
    if agreeing / len(ids) >= TARGET:
        print(f"  reached the {TARGET:.0%} target")
    # Step by step: the same requests get the same token counts (drafts included) and leave the
    # same number of free GPU blocks, in every step that schedules anything.
    first = next((step for step in sorted(set(sim.steps) | set(real.steps))
                  if sim.steps.get(step) != real.steps.get(step)), None)
    assert first is None, f"step {first}: simulator {sim.steps.get(first)}, vLLM {real.steps.get(first)}"
    if repro is not None:
        assert sim.totals[2] == real.totals[2] == sum(hit for _, hit in stock.values()) == repro
    if stock is not None:  # requests aborted before their first admission have none in either
        differ = [(r, sim.per_request[r][0], stock.get(r)) for r in ids
                  if r in stock and sim.per_request[r][0] != stock[r]]
        assert differ == [], f"vLLM's own connector admits differently: {differ[:3]}"


@pytest.mark.skipif(RELEASE < (0, 28, 0), reason="vLLM 0.28 reads the connector's opt-in")
def test_a_connector_opted_in_to_divergent_hits_is_admitted_alike_in_both_engines():
    """The reference opted in to a hybrid's divergent local hits (vLLM 0.28+,
    ``Scheduler._get_local_prefix_cache_hit``): told full attention's hit where the Mamba state
    was evicted (13 preemptions here), and the hit every group agrees on when it adds nothing.
    Both engines admit every request alike, step by step, and count the same GPU hit: the one
    admitted after that reconciliation, not the one the lookup was told (vLLM's side counted the
    latter, 1,216 GPU-hit tokens against 592, before ``AdmissionLedger._watch_agreed_hits``)."""
    settings = {"model": "qwen3-next"}
    ids, sim, real, _ = call_pinned(compare_opted_in, "shared-prefix-small", "sync", settings)
    assert sim.crash is None and real.crash is None
    assert [r for r in ids if sim.per_request[r] != real.per_request[r]] == []
    assert sim.steps == real.steps
    assert sim.totals == real.totals
    _, plain, _, _ = call_pinned(compare, "shared-prefix-small", "sync", settings)
    assert plain.totals[1:3] != sim.totals[1:3], "opting in changed no admission: the story lost its divergent hits"


@pytest.mark.vllm_on_demand  # scripts/vllm-on-demand; the main suite's story pins the observer's rule
@pytest.mark.parametrize("story", READMITTED)
def test_a_readmitted_requests_chunks_count_from_the_same_step_on_vllms_scheduler(story):
    """The smallest replay of the chunk that differed on the spec-decode-small gpu_blocks=24
    reserve_full_isl=false sync row (tests/engine/readmitted.py): a request re-admitted after
    preemption stores the chunk it filled last; both engines count it from the re-admission."""
    simulated, real = call_pinned(store_delays, readmitted_requests(READMITTED[story]), READMITTED[story])
    assert simulated == real


def table_row(name, scheduling, simulator: tuple, vllm: tuple, agreeing: int, total: int) -> str:
    """One row of docs/fidelity.md's differential table: the simulator's figure, "(=)" when
    vLLM's scheduler gives the same, else "simulator / vLLM"."""
    cells = [f"{ours:,} (=)" if ours == theirs else f"{ours:,} / {theirs:,}" for ours, theirs in zip(simulator, vllm)]
    return f"| {name} | {scheduling} | {' | '.join(cells)} | {agreeing}/{total} ({agreeing / total:.1%}) |"


def test_print_the_agreement_table():
    """Runs last in this module: the whole table."""
    if not _table:
        pytest.skip("no comparison ran")
    print("\n| workload | scheduling | steps | GPU-hit tokens | connector-hit tokens | preemptions | chunks stored "
          "| chunks loaded | flushed jobs | requests agreeing |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(_table))


@pytest.mark.vllm_on_demand
def test_the_repro_command_gives_the_same_numbers_under_any_callers_seed(tmp_path):
    """`kvoffload run --engine vllm-scheduler --connector stock` on the repro, called from a
    process with hash seed 1 and from this one (seed 0, as CI runs the vLLM stage; seeds 1 and 2
    gave 640 and 816 connector-hit tokens before the engine pinned its own): the same metrics,
    and the seed in the result's config. The seed-1 caller runs the replay in a child
    interpreter pinned to seed 0; this one, under CI's seed 0, runs it in process."""
    from kvoffload.cli import main

    repro = ["run", "--engine", "vllm-scheduler", "--connector", "stock", "--workload", "multi-turn-small",
             "--set", "cpu_chunks=32", "--set", "scheduling=sync", "--quiet", "--out"]
    done = subprocess.run([sys.executable, "-m", "kvoffload.cli", *repro, str(tmp_path / "seed1.json")],
                          env=dict(os.environ, PYTHONHASHSEED="1"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert main([*repro, str(tmp_path / "seed0.json")]) == 0
    results = [json.loads((tmp_path / f"seed{seed}.json").read_text()) for seed in (1, 0)]
    assert [r["config"]["python_hash_seed"] for r in results] == [HASH_SEED, HASH_SEED]
    counted = [{k: v for k, v in r["metrics"].items() if k not in MEASURED_METRICS} for r in results]
    assert counted[0] == counted[1]
    assert counted[0]["offload_hit_rate"] > 0 and counted[0]["poisoned_loads"] == 0
