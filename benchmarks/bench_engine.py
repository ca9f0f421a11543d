"""Wall time and peak memory of a whole engine replay, KV content oracle on (it always is).

The reference connector replays each full bundled workload. The full multi-turn workload (about
2,000 requests, 12,000 steps) is the yardstick: it should replay in no more than ~14 s and
within 2 GiB of peak memory on a CI runner. ``peakmem_`` counts the whole benchmark process:
the interpreter, torch, the generated workload and the replay.

A single replay takes seconds, so these benchmarks take few samples and no warm-up. kvoffload
(and with it torch) is imported in ``setup``, not at module import, so discovering the suite
stays cheap.
"""

from __future__ import annotations

from pathlib import Path

WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"


def workload_spec(name: str) -> str:
    """A bundled workload NAME as the path of its definition in this checkout (asv may run the
    package from a wheel, which does not carry the repository's workloads/ folder)."""
    path = WORKLOADS_DIR / f"{name}.toml"
    return str(path) if path.is_file() else name


class ReplayWorkload:
    params = [["shared-prefix", "multi-turn", "spec-decode"]]
    param_names = ["workload"]
    timeout = 300
    version = "1"
    number = 1  # one replay per sample
    repeat = (1, 3, 40.0)  # at most 3 samples or 40 s of them
    rounds = 1
    warmup_time = 0

    def setup(self, name):
        from kvoffload.runner import ConnectorChoice
        from kvoffload.workloads import load_workload

        self.workload = load_workload(workload_spec(name))
        self.fixes = ConnectorChoice.build().fixes

    def replay(self):
        from kvoffload.engine.engine import Engine

        record = Engine(self.workload.requests, self.workload.engine, self.fixes).run()
        if record.crash is not None:
            raise RuntimeError(f"{self.workload.name}: the reference connector crashed: {record.crash}")
        return record

    def time_replay(self, name):
        self.replay()

    def peakmem_replay(self, name):
        self.replay()
