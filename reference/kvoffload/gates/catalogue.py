"""The bug catalogue K01-K30 as the gates see it: one line per bug, and for each bug without a
gate class of its own (``class TestKnn...``) either the gate that covers it or why none can. The
simulator gates (tests/gates) and the packaged vLLM gates (``kvoffload.gates``) both read it."""

from __future__ import annotations

BUGS: dict[str, str] = {
    "K01": "final store built after on_request_finished (KeyError)",
    "K02": "finish hook while transfers in flight; reset leaks",
    "K03": "last block never offloaded; deferred store vs block reuse",
    "K04": "finished watermark includes a never-written slot",
    "K05": "final block dropped; stores never become hits",
    "K06": "store cursor passes blocks with no hash yet",
    "K07": "abort of a never-scheduled request (assert)",
    "K08": "completion for an already-freed request",
    "K09": "stores of a preempted request read reused blocks",
    "K10": "re-admitted with stores in flight (load XOR stores)",
    "K11": "keys / block_ids desync after preemption",
    "K12": "cross-stream RAW/WAR hazards",
    "K13": "allocations invisible to the fence under MultiConnector",
    "K14": "stale SWA block re-stored; duplicate ids in the fence",
    "K15": "SWA store horizon during chunked prefill",
    "K16": "unaligned SWA load exceeds the pending-block bound",
    "K17": "MTP/EAGLE on hybrids: every group a drafter",
    "K18": "Mamba state at a chunk boundary",
    "K19": "num_locally_computed_tokens assert (hybrid, spec)",
    "K20": "reset leaves stale per-request job ids (hang)",
    "K21": "reset says success, the tier still serves",
    "K22": "load failure crashes instead of recompute",
    "K23": "HIT_PENDING never resolves",
    "K24": "LRU/ARC evicts own inputs; prefix order",
    "K25": "prepare_store failure bookkeeping; retries",
    "K26": "block-size-factor geometry (load starting mid-chunk)",
    "K27": "prefix-cache hit metrics double counted",
    "K28": "failed stores stay visible",
    "K29": "decode offload frees slots still being copied",
    "K30": "prefetch leaks and load-back bugs on abort",
}

# Covered by a story written for another bug.
COVERED_BY: dict[str, str] = {
    "K26": "TestK05EveryStoredChunkIsServed: B's load starts at sub-block 1 of a 4-block chunk",
    "K29": "TestK03LastBlockAtFinish, TestK09PreemptedStoresAreFlushed: no freed block is rewritten "
           "while a store still copies it",
    "K30": "TestK08CompletionForAnAbortedRequest: aborts while loading and storing release everything",
}

# Gated in vLLM's scheduler only (kvoffload.gates), each with why the simulator has no story. A bug
# gated in both (a class of the same name in tests/gates and here) is in none of these lists.
VLLM_ONLY: dict[str, str] = {
    "K13": "needs a second connector beside the one under test (vLLM's MultiConnector with a remote-prefill "
           "peer); the simulator runs one connector per engine",
}

# Needs something this project does not model: one line each, no test that cannot fail.
NO_GATE: dict[str, str] = {
    "K12": "needs a real GPU and copy streams; the CPU model copies after the forward on purpose, and "
           "tests/worker/test_cuda.py checks stream ordering where a GPU exists",
}
