"""Workloads: turn a definition (TOML, Mooncake trace, ShareGPT file) into engine requests.

Public API::

    load_workload(spec, overrides=None) -> Workload   # NAME | PATH.toml | mooncake:FILE | sharegpt:FILE
    list_workloads() -> [(name, description)]         # bundled definitions (workloads/*.toml)
    describe_workload(workload) -> str                # multi-line summary
    reusable_prompt_share(workload) -> float          # infinite-cache reuse ceiling
    WorkloadError                                     # bad input; a one-line message
    DEFAULT_WORKLOAD = "multi-turn"

Module map: ``schema`` (typed TOML reads, WorkloadError), ``distributions``, ``tokens`` (random
ids, stand-in tokenizer), ``registry`` (generator registry, arrival order), one module per
generator (``shared_prefix``, ``multi_turn``, ``spec_decode``, ``mooncake``, ``sharegpt``),
``definition`` (load/list), ``summary`` (describe, reuse share).
"""

from kvoffload.workloads.definition import DEFAULT_WORKLOAD, Workload, list_workloads, load_workload
from kvoffload.workloads.schema import WorkloadError
from kvoffload.workloads.summary import describe_workload, reusable_prompt_share

__all__ = [
    "DEFAULT_WORKLOAD",
    "Workload",
    "WorkloadError",
    "describe_workload",
    "list_workloads",
    "load_workload",
    "reusable_prompt_share",
]
