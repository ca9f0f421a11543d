"""The mutation tool's two runs (docs/mutation.md) between them name every module of the package:
a module added without a test selection would never be sampled, and the score would read as the
whole package's while leaving it out. Every selection names test files that exist."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "reference" / "kvoffload"


@pytest.fixture(scope="module")
def targets(monkeypatch_module):
    monkeypatch_module.delenv("KVOFFLOAD_MUTATION_SET", raising=False)  # the first run's set
    monkeypatch_module.syspath_prepend(str(REPO / "scripts" / "mutation_tool"))
    for name in ("places", "targets_whole", "targets"):
        sys.modules.pop(name, None)
    first = importlib.import_module("targets")
    whole = importlib.import_module("targets_whole")
    yield first.TESTS_OF, whole.WHOLE_TESTS_OF, whole.LEFT_OUT
    for name in ("places", "targets_whole", "targets"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_module_is_in_one_run_or_left_out_by_name(targets):
    first, whole, left_out = targets
    modules = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py"))
    named = [*first, *whole, *left_out]
    assert sorted(set(named)) == sorted(named), "a module named twice"
    assert [module for module in modules if module not in named] == []
    assert [module for module in named if module not in modules] == []  # a module since removed


def test_every_selection_names_test_files_that_exist(targets):
    first, whole, _ = targets
    missing = {(module, path) for module, paths in {**first, **whole}.items() for path in paths
               if not (REPO / path).exists()}
    assert missing == set()
