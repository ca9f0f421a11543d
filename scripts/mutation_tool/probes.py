"""Probes for the mutants ``fates.py`` calls equivalent: each runs the original and the mutated
expression over every input the guarded code can see and asserts they agree. Those that replay
the engine live in ``replay_probes.py`` and ``oracle_probes.py``; this file runs them all.

    .venv/bin/python scripts/mutation_tool/probes.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from oracle_probes import (fence_violation_read_only, later_rejected_drafts, oracle_torch_writes_on_cpu,  # noqa: E402
                           oracle_write_paths, scripted_sequence_inputs)
from replay_probes import (aligned_hits, async_commit_guard, finish_refresh, held_set_rebuilt,  # noqa: E402
                           joins_without_placeholders, live_identity, reset_forgets_the_state, store_filter_or)


def one_key_index() -> None:
    """core/manager.py prepare_store: ``len(keys) == 1 and keys[0] not in chunks`` vs ``keys[-1]``."""
    chunks = {b"a": 1}
    for keys in ([b"a"], [b"b"], (b"a",), [b"a", b"b"], [], [b"b", b"a"]):
        for free in (0, 1):
            original = len(keys) == 1 and keys[0] not in chunks and free
            mutant = len(keys) == 1 and keys[-1] not in chunks and free
            assert original == mutant, keys


def enum_identity() -> None:
    """worker/connector.py: ``kind is TransferKind.STORE`` made ``==``. ``kind`` is a TransferKind
    or None; a plain Enum compares by identity, so both agree on every value it can hold."""
    from kvoffload.core.types import TransferKind

    for kind in (*TransferKind, None):
        for member in TransferKind:
            assert (kind is member) == (kind == member)
    assert TransferKind.__eq__ is object.__eq__ or TransferKind.__eq__.__qualname__.startswith("Enum")


def least_direction() -> None:
    """gate.py MEASURED_HIGHER_IS_BETTER: ``direction == "higher"`` made ``<=``. The glossary's
    directions are "higher", "lower", "zero" and "info" (metrics.Metric, held by test_facts), and
    "higher" sorts first among them: ``d <= "higher"`` holds for "higher" alone."""
    from kvoffload import gate
    from kvoffload.metrics import GLOSSARY

    directions = {metric.better for metric in GLOSSARY}
    assert directions <= {"higher", "lower", "zero", "info"}, directions
    assert all((d <= "higher") == (d == "higher") for d in directions)
    mutated = frozenset(name for name, direction, _ in GLOSSARY if name in gate.MEASURED and direction <= "higher")
    assert mutated == gate.MEASURED_HIGHER_IS_BETTER


def set_growth_threshold() -> None:
    """engine/set_order.py set_iteration_order: the growth rule's ``fill <= 50000`` made ``<= 49999``
    (CPython's ``set_add_entry``). The two differ only for a resize at a fill of exactly 50,000;
    a resize happens at the first fill with ``fill * 5 >= mask * 3``, and every table is a power
    of two (``_resized`` doubles from 8), so it happens at ceil(3 (2**k - 1) / 5), never 50,000."""
    from kvoffload.engine import set_order

    fills = {-(-3 * (2**k - 1) // 5) for k in range(3, 64)}
    assert 50000 not in fills
    assert {len(set_order._resized([None] * 8, used)) for used in range(0, 5000, 7)} <= {2**k for k in range(3, 16)}


def livelock_read_only() -> None:
    """engine/watchdog.py: ``@dataclass(frozen=True)`` made ``frozen=False`` on Livelock. Freezing
    forbids assigning a field and derives a hash; a Livelock holds a dict, so hashing one fails
    either way, and nothing assigns to one: the watchdog builds it in one expression and the
    engine, the one place that receives it, only reads it (as_dict, describe, alive)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "reference" / "kvoffload"
    builders = [path for path in package.rglob("*.py") if "Livelock(" in path.read_text()]
    assert builders == [package / "engine" / "watchdog.py"], builders
    engine = ast.parse((package / "engine" / "engine.py").read_text())
    observed = [node for node in ast.walk(engine) if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "attr", "") == "observe"]
    assert [target.id for node in observed for target in node.targets] == ["verdict"]
    assigned = [node for node in ast.walk(engine) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "verdict"]
    assert assigned == []
    watchdog = ast.parse((package / "engine" / "watchdog.py").read_text())
    livelock = next(node for node in watchdog.body if isinstance(node, ast.ClassDef) and node.name == "Livelock")
    assert not [node for node in ast.walk(livelock) if isinstance(node, (ast.Assign, ast.AugAssign))
                and any(isinstance(t, ast.Attribute) for t in getattr(node, "targets", [getattr(node, "target", None)]))]


def one_kind_of_job() -> None:
    """core/jobs.py check_invariants, I4: ``kinds == {True} or len(ids) == 1`` with ``==`` made
    ``<=``. ``kinds`` is the set of is_store over a request's job ids, and the check asserts the
    list is non-empty just before it: a non-empty subset of {True, False} is <= {True} exactly
    when it is {True}."""
    for kinds in ({True}, {False}, {True, False}):
        assert (kinds <= {True}) == (kinds == {True}), kinds
    assert (set() <= {True}) != (set() == {True})  # the one set where they differ: an empty list
    import inspect

    from kvoffload.core.jobs import JobRegistry

    source = inspect.getsource(JobRegistry.check_invariants)
    guard, check = source.index('assert ids, f"empty job list kept'), source.index("kinds == {True}")
    assert guard < check, "the non-empty check no longer comes first"


def draft_branch_bound() -> None:
    """engine/oracle.py forward: ``elif num_tokens > 1 and not item.prefill`` (drafts) made
    ``> 0``. The branch before it takes ``num_tokens == 1``, so the two agree on every integer."""
    for num_tokens in range(-3, 200):
        for prefill in (False, True):
            if num_tokens == 1:
                continue
            assert (num_tokens > 1 and not prefill) == (num_tokens > 0 and not prefill)


def reshape_any_negative() -> None:
    """engine/oracle.py check_loaded_slots: ``.reshape(-1)`` made ``.reshape(-2)``. The installed
    numpy (2.x) reads any negative size as the one unknown dimension: the same flat array for
    every (blocks, block size) table a load check builds. (A numpy that refused -2 would make
    every load check fail, and the gates would catch it.)"""
    import numpy as np

    for blocks in range(1, 9):
        for block_size in (1, 2, 4, 16):
            table = np.arange(blocks)[:, None] * block_size + np.arange(block_size)[None, :]
            assert np.array_equal(table.reshape(-2), table.reshape(-1))


def unset_abort_time() -> None:
    """engine/requests.py RequestSpec's check ``(abort_after_steps or 0) < 0`` made ``or 1``: the two
    differ only for a falsy value (None or 0), where both give a non-negative number."""
    for value in (None, 0, 1, 5, -1, -7):
        assert ((value or 0) < 0) == ((value or 1) < 0), value


def _set_order_ids() -> list[list[str]]:
    """Request-id-like strings as the set-order stories draw them (1, 2 and 4 bytes per code
    point), 200 lists of up to 300, and 200,000 more in one list."""
    import random

    rng = random.Random(0)
    prefixes = ["req-", "c3-t", "A", "\u00e9", "\u4e2d", "\U0001f600", ""]
    lists = [[rng.choice(prefixes) + str(rng.randrange(10 ** rng.randint(1, 9))) for _ in range(rng.randint(0, 300))]
             for _ in range(200)]
    return lists + [[f"req-{i}" for i in range(200_000)]]


def no_hash_of_minus_one() -> None:
    """engine/set_order.py str_hash: CPython's ``-2 if hash == -1`` (-1 is its error value) made
    ``-1``. They differ only for a string whose SipHash-1-3 is 2**64 - 1: none is known, and
    finding one takes about 2**64 tries. Checked: no id of the set-order stories' kind, 200,000
    and more under four seeds, hashes to -1 or -2 (either would need that value)."""
    from kvoffload.engine import set_order

    for seed in (set_order.HASH_SEED, 1, 4242, 2**32 - 1):
        for ids in _set_order_ids():
            assert all(set_order.str_hash(text, seed) not in (-1, -2) for text in ids)


def distinct_hashes() -> None:
    """engine/set_order.py _probe: ``entry[0] == hashed and entry[1] == text`` (already in the set)
    made ``or``. Equal texts have equal hashes, so the two differ only for two distinct strings
    with one 64-bit hash (a SipHash-1-3 collision, about 2**32 strings for an even chance). Checked:
    the ids of the set-order stories and 200,000 more, under four seeds, have distinct hashes, and
    the mutated probe gives the same orders."""
    import inspect
    import textwrap

    from kvoffload.engine import set_order

    source = textwrap.dedent(inspect.getsource(set_order._probe))
    original = "if entry[0] == hashed and entry[1] == text:"
    assert source.count(original) == 1
    namespace = dict(vars(set_order))
    exec(compile(source.replace(original, original.replace(" and ", " or ")), set_order.__file__, "exec"), namespace)
    lists = _set_order_ids()
    for seed in (set_order.HASH_SEED, 1, 4242, 2**32 - 1):
        for ids in lists:
            texts = set(ids)
            assert len({set_order.str_hash(text, seed) for text in texts}) == len(texts)
    kept = set_order._probe
    set_order._probe = namespace["_probe"]
    try:
        mutated = [set_order.set_iteration_order(ids) for ids in lists[:-1]]
    finally:
        set_order._probe = kept
    assert mutated == [set_order.set_iteration_order(ids) for ids in lists[:-1]]


PROBES = [one_key_index, store_filter_or, enum_identity, aligned_hits,
          live_identity, least_direction, async_commit_guard,
          set_growth_threshold, livelock_read_only, one_kind_of_job, finish_refresh,
          reset_forgets_the_state, oracle_write_paths, oracle_torch_writes_on_cpu, scripted_sequence_inputs,
          draft_branch_bound, reshape_any_negative, later_rejected_drafts, fence_violation_read_only,
          unset_abort_time, held_set_rebuilt, joins_without_placeholders, distinct_hashes,
          no_hash_of_minus_one]

from probes_whole import PROBES_WHOLE  # noqa: E402  (the run over the rest of the package)

PROBES += PROBES_WHOLE

if __name__ == "__main__":
    for probe in PROBES:
        probe()
        print(f"ok  {probe.__name__}")
