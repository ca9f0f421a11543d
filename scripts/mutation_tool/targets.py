"""What the tool mutates, and which tests run against each mutated module.

Per-mutant test selection: a mutant of a module runs only the test files that exercise that
module (found by what they import and by what their stories replay), sharpest and fastest first,
with ``-x``, so a killed mutant usually stops within seconds. The rest of the main suite, the
gate and the vLLM stage then run against the survivors only (``--stage``).
"""

from __future__ import annotations

# The gate stories replay core/ and engine/ end to end through the connector and the worker.
_GATES = ("tests/gates/test_k01_k05_finish.py", "tests/gates/test_k06_k20_lifecycle.py",
          "tests/gates/test_k21_k28_tier.py", "tests/gates/test_engine_model.py")
_CORE = ("tests/core",) + _GATES
# Not per mutant: the hypothesis property run (minutes) and the 24-seed async preemption sweep
# (over a minute); they run in the "main" stage against the survivors.
_ENGINE = ("tests/engine/test_vllm_rules.py", "tests/engine/test_spec_rules.py", "tests/engine/test_reset_rules.py",
           "tests/engine/test_engine_replays.py", "tests/engine/test_invariant_results.py",
           "tests/engine/test_watchdog.py", "tests/engine/test_replayed_rules.py") + _GATES + ("tests/metrics/test_glossary.py",)

TESTS_OF: dict[str, tuple[str, ...]] = {
    "core/fixes.py": _CORE,
    "core/jobs.py": _CORE,
    "core/manager.py": _CORE,
    "core/request.py": _CORE,
    "core/request_state.py": _CORE,
    "core/scheduler.py": _CORE,
    "core/stores.py": _CORE,
    "core/types.py": _CORE + ("tests/worker",),
    "engine/admission.py": _ENGINE,
    "engine/block_pool.py": _ENGINE,
    "engine/config.py": _ENGINE + ("tests/workloads/test_limits.py",),
    "engine/cost.py": _ENGINE + ("tests/perf/test_sizing.py",),
    "engine/engine.py": _ENGINE,
    "engine/feed.py": _ENGINE,
    "engine/final_chunks.py": ("tests/metrics/test_metrics.py",) + _ENGINE,
    "engine/live.py": _ENGINE,
    "engine/observer.py": _ENGINE,
    "engine/oracle.py": _ENGINE,
    "engine/record.py": _ENGINE,
    "engine/requests.py": _ENGINE,
    "engine/scheduler.py": _ENGINE,
    "engine/set_order.py": ("tests/engine/test_set_order.py",) + _ENGINE,
    "engine/spec.py": _ENGINE,
    "engine/watchdog.py": _ENGINE,
    "metrics.py": ("tests/metrics", "tests/core/test_facts.py", "tests/engine/test_invariant_results.py"),
    "gate.py": ("tests/gate",),
    "worker/connector.py": ("tests/worker",) + _GATES,
    "worker/copy.py": ("tests/worker",) + _GATES,
}

# Every test file of the main suite that a per-module selection may have left out runs in the
# "main" stage; the fix-flag check replays the gates itself, the benchmarks are timing only, and
# the hand list's anchor check reads source text (a generated mutant inside an anchor fails it
# by its text, not by what it does). The files that list the tree with `git ls-files` fail in the
# snapshot, which is no repository (a "kill" by them is their failure unmutated).
MAIN_SUITE_IGNORES = ("tests/gates/test_fix_flags.py", "tests/benchmarks", "tests/gates/test_mutant_anchors.py",
                      "tests/core/test_module_sizes.py", "tests/core/test_doc_references.py")

# The run over the rest of the package (KVOFFLOAD_MUTATION_SET=whole, places.py) mutates those
# modules instead, with their selections.
from places import SET  # noqa: E402
from targets_whole import VLLM_MODULES, WHOLE_TESTS_OF  # noqa: E402

if SET == "whole":
    TESTS_OF = WHOLE_TESTS_OF
