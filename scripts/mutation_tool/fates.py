"""Survivors of the whole CI shown equivalent, each with its probe: the reason no input tells
the mutant from the original, checked where a check is possible (``probes.py``). Keyed
``module:operator:occurrence`` of the run's commit (results/mutation/tool/score.json). Survivors
killed by a new test need no entry: the "new" stage records the test."""

FATES: dict[str, tuple[str, str]] = {
    "core/manager.py:core/NumberReplacer:31": (
        "equivalent",
        "keys[0] -> keys[-1] under `len(keys) == 1 and ...`: the `and` evaluates it only for a "
        "one-key sequence, whose first and last element are the same (probes.py: one_key_index)"),
}
