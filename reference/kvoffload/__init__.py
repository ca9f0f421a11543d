"""kvoffload-bench: a regression suite and benchmark for vLLM-style KV-cache offloading connectors."""

__version__ = "0.1.0"
