"""Load the ASV suite's modules by path: ``benchmarks/`` is not a package on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SUITE = Path(__file__).resolve().parents[2] / "benchmarks"


def load_suite_module(name: str) -> ModuleType:
    """The suite's module ``name``, as asv imports it: a module of a package (``benchmarks/``), so
    its relative imports (``from .samples import asv_samples``) resolve."""
    if "kvoffload_asv_suite" not in sys.modules:
        package = ModuleType("kvoffload_asv_suite")
        package.__path__ = [str(SUITE)]
        sys.modules["kvoffload_asv_suite"] = package
    qualified = f"kvoffload_asv_suite.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(qualified, SUITE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def suite():
    """``suite("bench_connector")`` -> the module, imported once per session."""
    return load_suite_module


def benchmark_methods(cls: type, prefixes=("time_", "track_", "peakmem_", "mem_", "timeraw_")) -> list[str]:
    return sorted(name for name in dir(cls) if name.startswith(prefixes))


@pytest.fixture(scope="session")
def methods_of():
    return benchmark_methods
