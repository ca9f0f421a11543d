"""Costs counted, not timed: CPU instructions under valgrind's callgrind (``kvoffload.counts``).

Beside the wall-time tracks (``BuildConnectorMeta``, the ``Measure*`` classes), which a shared
runner's load moves 2-30x, the same costs as instruction counts, which it does not:

- ``CountBuildConnectorMeta.track_instructions_per_step``: instructions inside
  ``build_connector_meta`` per decode step of ``BuildConnectorMeta``'s batch (256 decoding
  requests; blocks_per_chunk 1 and 4);
- ``CountReplay.track_instructions_per_request``: instructions of a whole replay of
  ``multi-turn-small`` through the reference, per request (the simulator's cost per request).

One count per commit is the whole truth on one machine (the same commit repeats within 1 % at
load 1 and at load 8: ``docs/performance.md``); a count depends on the interpreter, libraries and
valgrind, so compare them within one machine's line. Without valgrind, or with a package that
predates ``kvoffload.counts`` (an old commit of the history), the benchmarks are skipped (n/a).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

SUITE = Path(__file__).resolve().parent
WORKLOADS_DIR = SUITE.parent / "workloads"  # this checkout's definitions, as bench_workloads reads them


def _counts():
    if shutil.which("valgrind") is None:
        raise NotImplementedError("needs valgrind (apt-get install valgrind)")
    if importlib.util.find_spec("kvoffload.counts") is None:
        raise NotImplementedError("this commit's package cannot count instructions (no kvoffload.counts)")
    from kvoffload import counts

    return counts


class CountBuildConnectorMeta:
    """Instructions per decode step inside build_connector_meta: 256 running requests, one token each."""

    params = [[1, 4]]
    param_names = ["blocks_per_chunk"]
    timeout = 1800
    version = "1"

    def setup(self, blocks_per_chunk):
        self.counts = _counts()

    def track_instructions_per_step(self, blocks_per_chunk):
        return self.counts.count("connector", str(blocks_per_chunk), SUITE)

    track_instructions_per_step.unit = "instructions/step"


class CountReplay:
    """Instructions per request of one replay of a -small workload through the reference."""

    params = [["multi-turn-small"]]
    param_names = ["workload"]
    timeout = 1800
    version = "1"

    def setup(self, workload):
        self.counts = _counts()

    def track_instructions_per_request(self, workload):
        path = WORKLOADS_DIR / f"{workload}.toml"
        return self.counts.count("replay", str(path) if path.is_file() else workload)

    track_instructions_per_request.unit = "instructions/request"
