"""Probes for the mutants ``fates.py`` calls equivalent: each runs the original and the mutated
expression over every input the guarded code can see and asserts they agree.

    .venv/bin/python scripts/mutation_tool/probes.py
"""

from __future__ import annotations


def one_key_index() -> None:
    """core/manager.py prepare_store: ``len(keys) == 1 and keys[0] not in chunks`` vs ``keys[-1]``."""
    chunks = {b"a": 1}
    for keys in ([b"a"], [b"b"], (b"a",), [b"a", b"b"], [], [b"b", b"a"]):
        for free in (0, 1):
            original = len(keys) == 1 and keys[0] not in chunks and free
            mutant = len(keys) == 1 and keys[-1] not in chunks and free
            assert original == mutant, keys


PROBES = [one_key_index]

if __name__ == "__main__":
    for probe in PROBES:
        probe()
        print(f"ok  {probe.__name__}")
