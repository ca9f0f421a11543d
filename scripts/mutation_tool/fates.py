"""Survivors of the whole CI shown equivalent, each with its probe: the reason no input tells
the mutant from the original, checked where a check is possible (``probes.py``). Keyed
``module:operator:occurrence`` of the run's commit (results/mutation/tool/score.json).

NEW_TESTS: the tests written for a survivor, each shown failing on it by the "new" stage (which
plants the mutant and runs exactly these) and passing on the unmutated snapshot."""

NEW_TESTS: dict[str, tuple[str, ...]] = {
    "engine/cost.py:core/NumberReplacer:16": (
        "tests/engine/test_cost.py::test_both_profiles_move_kv_over_the_same_50_gb_per_s_link",),
}

FATES: dict[str, tuple[str, str]] = {
    "core/manager.py:core/NumberReplacer:31": (
        "equivalent",
        "keys[0] -> keys[-1] under `len(keys) == 1 and ...`: the `and` evaluates it only for a "
        "one-key sequence, whose first and last element are the same (probes.py: one_key_index)"),
    "core/stores.py:core/ReplaceAndWithOr:1": (
        "equivalent",
        "the decode-step filter's last `and` made `or` lets through requests whose watermark is "
        "below their next chunk's end; _store_request returns for them without a change "
        "(probes.py: store_filter_or, every such call on the -small workloads and chunked prefills)"),
    "engine/admission.py:core/NumberReplacer:15": (
        "equivalent",
        "_admit_new's `count = 0 if hits` made `-1 if hits`: with hits the count only enters "
        "cdiv(num_local + hits + count, bs), equal for x and x - 1 when x is a positive multiple of bs, "
        "and a whole-block GPU prefix plus a chunk-aligned hit is one (probes.py: aligned_hits, every "
        "hit of the -small workloads sync and async and of two-block chunks)"),
    "engine/observer.py:core/NumberReplacer:29": (
        "equivalent",
        "the trace events' pid 0 made 1: the observer is the only writer of trace events and gives "
        "all of them one pid, so the Chrome trace shows the same rows (probes.py: trace_pid)"),
    "engine/scheduler.py:core/ReplaceComparisonOperator_Eq_IsNot:1": (
        "equivalent",
        "_schedule_waiting's `asynchronous` flag only adds the placeholders of a request joining "
        "from the queue, and such a request has none (probes.py: admitted_without_placeholders, "
        "every admission of the -small workloads and tight-pool preemption runs, sync and async)"),
    "worker/connector.py:core/ReplaceComparisonOperator_Is_Eq:1": (
        "equivalent",
        "`kind is TransferKind.STORE` made `==`: a plain Enum compares by identity, and kind is a "
        "member or None (probes.py: enum_identity)"),
}
