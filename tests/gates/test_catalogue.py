"""Every catalogued bug has a gate class, a gate that covers it, or a one-line reason it has none."""

from __future__ import annotations

import re
from pathlib import Path

from catalogue import BUGS, COVERED_BY, NO_GATE, VLLM_ONLY

GATES = Path(__file__).parent


def test_every_bug_is_gated_or_explained():
    classes = {f"K{m}" for path in GATES.glob("test_*.py")
               for m in re.findall(r"^class TestK(\d\d)", path.read_text(), re.M)}
    assert set(BUGS) == {f"K{n:02d}" for n in range(1, 31)}
    unaccounted = [bug for bug in BUGS
                   if bug not in classes and bug not in COVERED_BY and bug not in NO_GATE and bug not in VLLM_ONLY]
    assert unaccounted == []
    assert not (classes & set(NO_GATE)), "a bug with a gate is still listed as not modelled"
    assert not (classes & set(VLLM_ONLY)), "a bug with a simulator gate is still listed as vLLM's scheduler only"
    assert not (set(VLLM_ONLY) & set(NO_GATE)), "a bug gated in vLLM's scheduler is listed as not modelled"
    required = {"K01", "K02", "K03", "K04", "K05", "K06", "K07", "K08", "K09", "K10", "K11", "K14", "K20",
                "K22", "K24", "K25", "K27"}
    assert required <= classes
    for name in list(COVERED_BY.values()):
        gate = name.split(":")[0].split(",")[0].strip()
        assert any(gate in path.read_text() for path in GATES.glob("test_*.py")), gate


def test_every_gate_class_is_in_the_packaged_vllm_gates():
    """The packaged gates (``kvoffload.gates``, vLLM's scheduler) hold a class of the same name for
    every simulator gate class here, and one for every bug marked not modelled (it skips with the
    catalogue's reason): no catalogue gate is missing from ``pytest --pyargs kvoffload.gates``."""
    packaged_dir = GATES.parents[1] / "reference" / "kvoffload" / "gates"
    packaged = {m for path in packaged_dir.glob("test_*.py")
                for m in re.findall(r"^(?:class )?(TestK\d\d\w*)", path.read_text(), re.M)}
    simulator = {m for path in GATES.glob("test_*.py") for m in re.findall(r"^class (TestK\d\d\w*)", path.read_text(), re.M)}
    assert simulator - packaged == set()
    assert {"K" + name[5:7] for name in packaged} == {bug for bug in BUGS if bug not in COVERED_BY}


def test_a_bug_gated_in_vllm_only_has_a_real_gate_there():
    """K13 has no simulator story (one connector per engine): its packaged gate must be a real
    one, a class with a test, not the catalogue's skip."""
    packaged_dir = GATES.parents[1] / "reference" / "kvoffload" / "gates"
    text = "\n".join(path.read_text() for path in packaged_dir.glob("test_*.py"))
    for bug in VLLM_ONLY:
        assert re.search(rf"^class TestK{bug[1:]}\w*:\n(?:.*\n)*?    def test_", text, re.M), bug
        assert f'_not_modelled("{bug}")' not in text
