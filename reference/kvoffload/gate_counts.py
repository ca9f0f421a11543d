"""The gate's counted numbers: instructions per ``build_connector_meta`` step under callgrind
(``kvoffload.counts``), the connector's cost in a unit a shared runner's load cannot move.

``--update`` writes the count into the baseline (``counted``), with what it depends on besides
the code (``count_environment``: valgrind, the interpreter, the architecture). A later gate on the
same machine and environment counts again and compares: more than ``COUNT_BOUND`` above the
baseline is "costlier" and fails the gate (not only with ``--strict``: unlike wall time, the count
repeats within ``COUNT_NOISE`` at any load; ``docs/performance.md`` has the measurements). On
another machine or environment, or without valgrind, it is "not compared", and the gate does not
spend the count's half minute there.
"""

from __future__ import annotations

from kvoffload import counts

COUNTED_RUN = "build_connector_meta/blocks_per_chunk=1"  # the decode batch BuildConnectorMeta times
COUNTED_METRIC = "instructions_per_step"
COUNT_NOISE = 0.01  # the same code counts within this, at load 1 and at load 8
COUNT_BOUND = 0.03  # two counts within COUNT_NOISE differ by ~2 % at most; a 5 % slowdown is beyond


def key() -> str:
    return f"{COUNTED_RUN}/{COUNTED_METRIC}"


def collect() -> dict[str, float]:
    """{key: instructions per step}, or {} where valgrind or the checkout's suite is missing."""
    if not counts.available() or not (counts.SUITE / "bench_connector.py").is_file():
        return {}
    return {key(): counts.count("connector", COUNTED_RUN.rsplit("=", 1)[1])}


def environment() -> dict[str, str]:
    return counts.environment() if counts.available() else {}


def comparable(baseline: dict, machine: str) -> bool:
    """Whether this gate can compare the baseline's counts: same machine, same count environment."""
    return bool(baseline.get("counted")) and baseline.get("machine") == machine and counts.available() \
        and baseline.get("count_environment") == environment()


def verdicts(baseline: dict, counted: dict[str, float], machine: str) -> list[tuple]:
    """(run, metric, baseline, now, verdict, allowed) per counted number of the baseline."""
    rows = []
    for name, before in sorted((baseline.get("counted") or {}).items()):
        run, metric = name.rsplit("/", 1)
        now = counted.get(name)
        if now is None:
            why = ("not compared" if baseline.get("machine") != machine or counts.available()
                   else "not compared (no valgrind)")
            rows.append((run, metric, before, None, why, ""))
        else:
            costlier = now > before * (1 + COUNT_BOUND)
            rows.append((run, metric, before, now, "costlier" if costlier else "ok", f"+{COUNT_BOUND:.0%}"))
    return rows
