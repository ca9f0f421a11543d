"""The ASV suite of kvoffload-bench (numpy style: ``bench_<area>.py``, one class per concern).

asv reads every tracked number as lower-is-better, so the suite tracks miss rates, counts of
things that must stay zero, delays, seconds per token and microseconds per step. How to run it:
``benchmarks/README.md``.
"""
