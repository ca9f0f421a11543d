"""The bug catalogue lives in the package (``kvoffload.gates.catalogue``): the packaged vLLM gates
skip the bugs it marks as not modelled with its reasons."""

from kvoffload.gates.catalogue import BUGS, COVERED_BY, NO_GATE, VLLM_ONLY  # noqa: F401
