"""The mutant list: (name, file, exact old text, new text, why it matters).

Each old text must occur exactly once in its file; otherwise the runner reports the mutant as
NOT APPLICABLE (loudly, never as killed): after a refactor, update the anchor here.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

SCHED = "reference/kvoffload/core/scheduler.py"
STORES = "reference/kvoffload/core/stores.py"
JOBS = "reference/kvoffload/core/jobs.py"
MANAGER = "reference/kvoffload/core/manager.py"
FIXES = "reference/kvoffload/core/fixes.py"
POOL = "reference/kvoffload/engine/block_pool.py"
ENGINE = "reference/kvoffload/engine/engine.py"
ESCHED = "reference/kvoffload/engine/scheduler.py"
ORACLE = "reference/kvoffload/engine/oracle.py"
RECORD = "reference/kvoffload/engine/record.py"  # owns the continuation rule (last_written_chunk_end)
METRICS = "reference/kvoffload/metrics.py"
WORKER = "reference/kvoffload/worker/connector.py"
ADMISSION = "reference/kvoffload/engine/admission.py"
OBSERVER = "reference/kvoffload/engine/observer.py"


class Mutant(NamedTuple):
    name: str
    path: str
    old: str
    new: str
    why: str
    listed: bool = False  # named in the issue: must be killed


def _fix_flag_mutants() -> list[Mutant]:
    from kvoffload.core.fixes import Fixes

    return [Mutant(f"flag:{field.name}", FIXES, f"    {field.name}: bool = True\n",
                   f"    {field.name}: bool = False\n", "the fix made ineffective", listed=True)
            for field in dataclasses.fields(Fixes) if field.type in (bool, "bool")]


MUTANTS: list[Mutant] = _fix_flag_mutants() + [
    # ---- the nine survivors and its hang -------------------------------------------
    Mutant("aborted watermark + 1", STORES, "watermark = req.num_computed_tokens  # PR #49285",
           "watermark = req.num_computed_tokens + 1  # PR #49285", "abort at 7 computed poisons", True),
    Mutant("freed blocks forward", POOL, "for block in reversed(blocks):", "for block in blocks:",
           "GPU cache evicts the prefix head first", True),
    Mutant("percentile floor rank", METRICS, "rank = max(1, -(-len(ordered) * q // 100))",
           "rank = max(1, len(ordered) * q // 100)", "p50/p99 one rank low", True),
    Mutant("submit p99 as p50", METRICS, "percentile(record.store_submit_delays, 99)",
           "percentile(record.store_submit_delays, 50)", "p99 = p50", True),
    Mutant("visible p99 as p50", METRICS, "percentile(record.store_visible_delays, 99)",
           "percentile(record.store_visible_delays, 50)", "p99 = p50", True),
    Mutant("offload hit numerator first admissions", METRICS, "_ratio(record.admission_hit_tokens,",
           "_ratio(record.connector_hit_tokens_admitted,", "hit rate numerator", True),
    Mutant("fence_violations hard-coded 0", METRICS, '"fence_violations": len(record.fence_violations),',
           '"fence_violations": 0,', "the metric hides a fence break", True),
    Mutant("continuation boundary num_tokens", RECORD, "written = num_tokens - 1",
           "written = num_tokens", "last_block_hit_rate asks for an unwritten chunk", True),
    Mutant("fence check ignores loads", ORACLE, "for r, b in writes.items()] + load_writes:",
           "for r, b in writes.items()]:", "a load into a block still read goes unseen", True),
    Mutant("GPU cache commits past written KV", ESCHED,
           "full_blocks = min(req.num_computed_tokens + num_new, req.num_tokens) // self.config.block_size",
           "full_blocks = -(-min(req.num_computed_tokens + num_new, req.num_tokens) // self.config.block_size)",
           "a GPU prefix hit serves an unwritten slot", True),
    Mutant("acknowledge never removes the job", JOBS,
           "        self._remove(job)\n        return CompletedJob(", "        return CompletedJob(",
           "a replay never ends (must fail fast)", True),
    # ---- core/ ----------------------------------------------------------------------------
    Mutant("no flush for preempted requests", SCHED, "flush.update(self.jobs.jobs_of(req_id))", "pass",
           "K09 poison"),
    Mutant("no scheduler fence", SCHED, "flush.update(self.jobs.stores_reading(allocated))", "pass", "K03 poison"),
    Mutant("running prompt-only stores outputs", STORES, "        if finished or self._prompt_only:",
           "        if finished:", "offload_prompt_only ignored while a request runs"),
    Mutant("finish re-ranks in insertion order", MANAGER, "self.touch(sorted(accessed, key=accessed.__getitem__))",
           "self.touch(list(accessed))", "rank-at-insert recency: the tail must go first"),
    Mutant("no flush of a reused final store", STORES, "flush.add(job_id)  # its blocks", "pass  # its blocks",
           "K03 poison"),
    Mutant("cursor advances on allocation failure", STORES,
           "self.stats.store_allocation_failures += 1\n            return",
           "self.stats.store_allocation_failures += 1\n            state.move_cursor(num_chunks, tpc)\n"
           "            return", "K25: chunks never stored"),
    Mutant("running watermark one short", STORES,
           "num_chunks = min(req.num_computed_tokens + num_scheduled, len(req.all_token_ids)) // tpc",
           "num_chunks = min(req.num_computed_tokens + num_scheduled - 1, len(req.all_token_ids)) // tpc",
           "stores less"),
    Mutant("lookup does not stop at a miss", SCHED, "            if result is MISS:\n                break",
           "            if result is MISS:\n                continue", "loads a missing chunk"),
    Mutant("pending chunk not deferred", SCHED, "pending |= result is PENDING",
           "pending |= False", "loads a chunk still being stored"),
    Mutant("failed store counted as success", SCHED, "succeeded = done.job_id not in self._failed_jobs",
           "succeeded = True", "K28: a failed store becomes loadable"),
    Mutant("failed load not reported", WORKER, "self._load_error_blocks.update(job.gpu_block_ids)", "pass",
           "K22: garbage served"),
    Mutant("release with jobs in flight", SCHED,
           "        if self._has_jobs(state):\n            return\n        if self.fixes.deferred_finish_signal:",
           "        if self.fixes.deferred_finish_signal:", "K08: completion for a released request"),
    Mutant("reset keeps the store cursor", SCHED,
           "            state.move_cursor(0, self._tokens_per_chunk)\n            if not self.fixes.reset_clears",
           "            if not self.fixes.reset_clears",
           "after a reset nothing is stored again"),
    Mutant("lookup counts deferred queries", SCHED,
           "        if hits is None:\n            self.stats.deferred_lookups += 1\n",
           "        if hits is None:\n            self.stats.deferred_lookups += 1\n            self.stats.lookups += 1\n",
           "K27: a lookup counted twice"),
    Mutant("fence_request fences nothing", JOBS, "            if job.is_store:\n                self._fence(job)",
           "            if job.is_store:\n                pass", "in-flight stores of a finished request unfenced"),
    Mutant("store evicts its own inputs", MANAGER, "if key not in protected and chunks[key].ref_count == 0:",
           "if chunks[key].ref_count == 0:", "K24(a)"),
    Mutant("failed store stays visible", MANAGER,
           "                del self._chunks[key]\n                self._lru.pop(key, None)\n",
           "                chunk.ref_count = 0\n                self._lru[key] = None\n", "K28"),
    Mutant("pending chunk looks ready", MANAGER,
           "return LookupResult.HIT_PENDING if chunk.ref_count < 0 else LookupResult.HIT",
           "return LookupResult.HIT", "K23: a load of an unfinished store"),
    Mutant("touch makes the tail newest", MANAGER, "        for key in reversed(keys):\n            if key in lru:",
           "        for key in keys:\n            if key in lru:", "K24: prefix head evicted first"),
    Mutant("reset keeps the chunks", MANAGER, "        self._chunks.clear()\n        self._lru.clear()\n",
           "        self._lru.clear()\n", "K21: served after reset"),
    # ---- engine/ --------------------------------------------------------------------------
    Mutant("preemption keeps computed tokens", ESCHED, "live.req.num_computed_tokens = 0", "pass",
           "resumes on freed blocks"),
    Mutant("a step that preempted admits", ESCHED, "        if not preempted:\n", "        if True:\n",
           "admission in the step that freed blocks by preemption"),
    Mutant("victim to the back of the queue", ESCHED, "self.waiting.appendleft(live)", "self.waiting.append(live)",
           "later arrivals pass a preempted request"),
    Mutant("full hit computes no token", ESCHED, "min(live.loaded_tokens, req.num_tokens - 1)",
           "min(live.loaded_tokens, req.num_tokens)", "nothing samples the first output"),
    Mutant("loaded blocks cached only when run", ADMISSION,
           "        self.scheduler.commit_computed(live, live.loaded_tokens)", "        pass",
           "an aborted loader's blocks never reach the GPU prefix cache"),
    Mutant("re-admission counted as first", OBSERVER, "        if live.admitted:\n", "        if False:\n",
           "gpu_hit_rate's denominator with preemptions"),
    Mutant("rejected drafts count as written", OBSERVER,
           "valid_end = start + 1 + item.accepted if item.num_tokens > 1 and not item.prefill else end",
           "valid_end = end", "store delays of chunks ending in rejected drafts"),
    Mutant("loaded slots not checked", ENGINE,
           "self.record.poisoned += self.oracle.check_loaded_slots(load.live, load.job, step)", "pass",
           "the content oracle switched off"),
    Mutant("failed load not recomputed", ENGINE, "load.live.loaded_tokens = failed[0]",
           "pass", "K22: garbage treated as computed"),
    Mutant("fence check ignores forwards", ORACLE, "[(r, b, \"forward\") for r, b in writes.items()] + load_writes",
           "load_writes", "a forward into a block still read goes unseen"),
    # ---- metrics.py -----------------------------------------------------------------------
    Mutant("last-block numerator counts ineligible", METRICS, "sum(c.served for c in eligible)",
           "sum(c.served for c in record.continuations)", "numerator"),
    Mutant("gpu hit rate over all prompt tokens", METRICS, "_ratio(record.gpu_hit_tokens, record.admitted_prompt_tokens)",
           "_ratio(record.gpu_hit_tokens, record.prompt_tokens)", "denominator"),
    Mutant("copy rate counts stores only", METRICS, "(record.store_bytes + record.load_bytes) / 1e9",
           "record.store_bytes / 1e9", "numerator"),
    Mutant("crashes never counted", METRICS, '"crashes": int(record.crash is not None),', '"crashes": 0,', "zero"),
    # ---- the worker's fence ---------------------------------------------------------------
    Mutant("worker never waits", WORKER, "            self.handler.wait(plan.jobs_to_flush)", "            pass",
           "K03/K09 poison"),
    Mutant("flushed stores not submitted first", WORKER, "            self._unsubmitted_stores.extend(flushed)",
           "            pass", "PR #48596 worker half"),
]
