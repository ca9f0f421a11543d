"""Repeated measurements in the form asv's runner reads from a timing benchmark.

One owner for the form, used by every benchmark that returns samples (``bench_connector``,
``bench_workloads``'s ``Measure*`` classes). No kvoffload import: the suite is imported against
old commits' packages.
"""

from __future__ import annotations


def asv_samples(values: list[float]) -> dict:
    """``values`` as asv keeps a timing benchmark's samples.

    asv (``asv.runner._run_benchmark_single_param``) reads a result ``{"samples": [...], "number": n}``
    as a timing benchmark's and keeps asv's own statistics of the samples: the median as the
    value, and the quartiles, the 99 % interval and the count beside it (``stats_q_25`` ...
    ``stats_repeat`` in the result file), which ``kvoffload report`` draws as the spread.
    """
    return {"samples": [float(v) for v in values], "number": 1}
