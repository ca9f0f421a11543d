"""The probes of the KV content oracle's survivors (engine/oracle.py, and the fence violations it
records): each replays with the mutant's code beside the original and asserts the records agree.
Run by ``probes.py`` with the others; the replay helpers are ``replay_probes.py``'s."""

from __future__ import annotations

from replay_probes import _mutated_method, _outcome, _replay_clean, _replays


def oracle_write_paths() -> None:
    """engine/oracle.py forward: a prefill of at most SMALL_WRITE positions takes the Python slot
    path, a longer one numpy's, and the mutant (``<=`` made ``>``) swaps them. Both compute the
    slot of each position as ``blocks[position // bs] * bs + position % bs``, and no two
    requests write one slot in one step (a shared block is a cached one, never rewritten), so
    every step writes the same slot -> fingerprint map. Checked: the mutated method beside the
    original on the -small workloads, sync and async, each step's writes and every record equal."""
    from kvoffload.engine.oracle import SMALL_WRITE, KVOracle

    original, write = KVOracle.forward, KVOracle._write_slots
    mutated = _mutated_method(KVOracle, "forward", "elif num_tokens <= SMALL_WRITE:", "elif num_tokens > SMALL_WRITE:")
    writes: list = []
    prefills = {"small": 0, "big": 0}

    def recorded(self, slots, values):
        writes.append(dict(zip(slots.tolist(), values.tolist())))
        return write(self, slots, values)

    def counted(self, scheduled):
        for item in scheduled:
            if item.prefill and item.num_tokens > 1:
                prefills["small" if item.num_tokens <= SMALL_WRITE else "big"] += 1
        return mutated(self, scheduled)

    KVOracle._write_slots = recorded
    try:
        before = [_outcome(requests, config) for requests, config in _replays()]
        written_before, writes[:] = list(writes), []
        KVOracle.forward = counted
        after = [_outcome(requests, config) for requests, config in _replays()]
    finally:
        KVOracle.forward, KVOracle._write_slots = original, write
    assert before == after and written_before == writes
    assert prefills["small"] and prefills["big"], prefills
    print(f"    {len(written_before)} forward steps ({prefills['small']} prefills of at most {SMALL_WRITE} positions, "
          f"{prefills['big']} longer): the same slots and fingerprints, the same records")


def oracle_torch_writes_on_cpu() -> None:
    """engine/oracle.py KVOracle.__init__: ``numpy() if device is cpu else None`` made ``if not``.
    On the CPU (CI has no GPU) the oracle then writes and reads its slots through torch indexing
    instead of a numpy view of the same storage: the same bytes, only slower. (On a GPU the
    mutant would call .numpy() on a CUDA tensor and fail.) Checked: the mutated constructor
    beside the original on the -small workloads, sync and async: every record equal."""
    from kvoffload.engine.oracle import KVOracle

    original = KVOracle.__init__
    mutated = _mutated_method(KVOracle, "__init__", 'if kv.gpu.device.type == "cpu"', 'if not kv.gpu.device.type == "cpu"')
    torch_path = 0

    def watched(self, *args, **kwargs):
        nonlocal torch_path
        mutated(self, *args, **kwargs)
        torch_path += self._slot_fp_np is None

    before = [_outcome(requests, config) for requests, config in _replays()]
    KVOracle.__init__ = watched
    try:
        after = [_outcome(requests, config) for requests, config in _replays()]
    finally:
        KVOracle.__init__ = original
    assert before == after and torch_path == len(after)
    print(f"    {len(after)} replays through torch's indexing on the CPU: the same records")


def scripted_sequence_inputs() -> None:
    """engine/oracle.py scripted_sequence's fast path, ``isinstance(tokens, array) and typecode ==
    TOKEN_TYPECODE and len(tokens) == num_prompt_tokens``, mutated two ways: ``and`` made ``or``,
    and ``==`` made ``is not``. A request's fingerprints are made at its first forward or load
    check, before any output is appended: every call sees its prompt as an int32 array of prompt
    length, where the first mutant takes the same path, and the second takes the fast path or
    the fallback (``is not`` on equal ints: False for CPython's cached small ints), which give the
    same sequence. Checked on every call of the -small workloads, sync and async, and of prompts
    past 256 tokens."""
    from array import array

    import numpy as np

    from kvoffload.core.types import TOKEN_TYPECODE
    from kvoffload.engine import oracle
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.requests import RequestSpec

    original = oracle.scripted_sequence
    calls = long_prompts = 0

    def checked(live):
        nonlocal calls, long_prompts
        tokens = live.req.all_token_ids
        assert isinstance(tokens, array) and tokens.typecode == TOKEN_TYPECODE, type(tokens)
        assert len(tokens) == live.spec.num_prompt_tokens, (live.req_id, len(tokens))
        fast = original(live)
        assert np.array_equal(fast, np.asarray(live.truth, dtype=np.int64))  # the fallback's sequence
        calls += 1
        long_prompts += len(tokens) > 256
        return fast

    long = [RequestSpec(f"L{i}", tuple(range(3 + i, 303 + i)), (7, 8), arrival_step=i) for i in range(3)]
    roomy = EngineConfig(gpu_blocks=256, cpu_chunks=256, block_size=16, max_num_batched_tokens=512)
    oracle.scripted_sequence = checked
    try:
        _replay_clean(_replays() + [(long, roomy.replace(scheduling=mode)) for mode in ("sync", "async")])
    finally:
        oracle.scripted_sequence = original
    assert calls > 0 and long_prompts > 0
    print(f"    {calls} fingerprint sequences made, {long_prompts} of prompts past 256 tokens: each from a "
          "prompt-length int32 array, fast path equal to the fallback")


def later_rejected_drafts() -> None:
    """engine/oracle.py _draft_fingerprints: ``j < item.accepted`` made ``j is not item.accepted``:
    every draft but the first rejected one then gets its true fingerprint. Only loads read a
    slot's fingerprint, and only from stored chunks; a chunk is stored once its positions are
    computed (the forward that computes a position rewrites its slot), or, without the final-
    token watermark (K04), up to the final token, which is the bonus token after the accepted
    drafts: the first rejected draft's slot. So the later rejected drafts' slots are rewritten
    before anything reads them. Checked: the mutated method beside the original on the
    spec-decode-small workload and on K04's story (k = 2 and 3, accepting 0 or 1, prompts of 3
    to 8, 2 to 5 outputs), each sync and async, with every fix and without the watermark: the
    same records (poisoned loads included), and the mutant does write true fingerprints there."""
    from kvoffload.core.fixes import Fixes
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.oracle import KVOracle
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.workloads import load_workload

    original = KVOracle._draft_fingerprints
    mutated = _mutated_method(KVOracle, "_draft_fingerprints", "if j < item.accepted and", "if j is not item.accepted and")
    differing = 0

    def counted(self, item):
        nonlocal differing
        written = mutated(self, item)
        differing += sum(mine != theirs for mine, theirs in zip(written, original(self, item)))
        return written

    def tokens(seed, n):
        return tuple((seed * 7919 + i * 104729) % 30000 + 3 for i in range(n))

    tiny = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
    runs = []
    for k in (2, 3):
        for accepts in ((0,), (1,)):
            for prompt in range(3, 9):
                for outputs in range(2, 6):
                    a = RequestSpec("A", tokens(1, prompt), tokens(2, outputs), accept_counts=accepts)
                    c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + tokens(77, 4), tokens(78, 2),
                                    parent="A", think_steps=3)
                    runs.append(([a, c], tiny.replace(spec_tokens=k)))
    spec = load_workload("spec-decode-small")
    runs.append((spec.requests, spec.engine))
    runs = [(requests, config.replace(scheduling=mode), fixes) for requests, config in runs for mode in ("sync", "async")
            for fixes in (Fixes(), Fixes().without("final_token_watermark"))]
    before = [_outcome(*run) for run in runs]
    KVOracle._draft_fingerprints = counted
    try:
        after = [_outcome(*run) for run in runs]
    finally:
        KVOracle._draft_fingerprints = original
    assert before == after
    poisoned = sum(metrics["poisoned_loads"] > 0 for metrics, *_ in before)
    assert differing > 0 and poisoned > 0, (differing, poisoned)
    print(f"    {len(runs)} replays ({poisoned} with poisoned loads): the same records; {differing} draft slots "
          "the mutant wrote with their true fingerprint")


def fence_violation_read_only() -> None:
    """engine/record.py: ``@dataclass(frozen=True)`` made ``frozen=False`` on FenceViolation. Freezing
    forbids assigning a field and derives a hash; nothing does either: the oracle builds each one
    in one expression (the one place that does), the engine appends them to the record's list and
    formats the first, the metrics count them. Checked on the fence story of tests/metrics (A's
    freed final block handed to B before A's final store is copied), with and without
    submit-before-wait, sync and async: under the original's frozen class with hashing made to
    fail, the runs and their metrics complete, with violations where the fix is off."""
    from pathlib import Path

    from kvoffload.core.fixes import Fixes
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.engine import Engine
    from kvoffload.engine.record import FenceViolation
    from kvoffload.engine.requests import RequestSpec
    from kvoffload.metrics import compute_metrics

    package = Path(__file__).resolve().parents[2] / "reference" / "kvoffload"
    builders = [path.relative_to(package).as_posix() for path in package.rglob("*.py") if "FenceViolation(" in path.read_text()]
    assert builders == ["engine/oracle.py"], builders

    def unhashable(self):
        raise AssertionError("a FenceViolation was hashed")

    config = EngineConfig(gpu_blocks=32, cpu_chunks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=128)
    a = RequestSpec("A", tuple(range(10, 16)), (20, 21, 22))
    c = RequestSpec("C", a.prompt_token_ids + a.output_token_ids + (30, 31, 32, 33), (40, 41), parent="A", think_steps=3)
    b = RequestSpec("B", tuple(range(100, 220)), (54, 55), parent="A", think_steps=0)
    hash_before, FenceViolation.__hash__ = FenceViolation.__hash__, unhashable
    seen = 0
    try:
        for mode in ("sync", "async"):
            for fixes in (Fixes(), Fixes().without("flush_submits_before_wait")):
                record = Engine([a, c, b], config.replace(scheduling=mode), fixes, max_steps=200).run()
                assert record.crash is None, record.crash
                assert compute_metrics(record)["fence_violations"] == len(record.fence_violations)
                seen += len(record.fence_violations)
                [str(violation) for violation in record.fence_violations]
    finally:
        FenceViolation.__hash__ = hash_before
    assert seen > 0, "no fence violation: the probe did not reach one"
    print(f"    {seen} fence violations recorded, counted and formatted; none hashed or assigned")
