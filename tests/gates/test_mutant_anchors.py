"""The mutation run (scripts/mutation) plants each mutant by replacing an exact text. A refactor
that moves or rewords that text turns the mutant into "not applicable" and the score quietly
measures fewer bugs; this test fails first, in the ordinary suite, naming the mutant to re-anchor."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutants():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutation" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


MUTANTS = _mutants()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[mutant.name for mutant in MUTANTS])
def test_every_mutant_finds_its_text_exactly_once(mutant):
    source = (ROOT / mutant.path).read_text()
    assert source.count(mutant.old) == 1, f"{mutant.name}: re-anchor it in scripts/mutation/mutants.py"
    assert mutant.new != mutant.old  # a mutant that changes nothing would be "killed" by nothing
