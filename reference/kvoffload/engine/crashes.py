"""A connector's exception as a run's verdict: whatever it raises, of any type, in any engine.

The record keeps the exception's type, a one-line message (an empty one replaced by the failing
line: a bare ``assert x`` says nothing else), the connector's own frames and the whole
traceback. The connector's own frames are those below the replay's last frame, without the
replay's wrappers and vLLM's engine machinery (scheduler, engine core, model runner): where the
connector's code, vLLM's, the reference's or anyone's, went wrong.

A connector that fails while it is being built or registered never ran: its verdict is one
"could not start: ..." (``starting``), which every command and the gates report once.
"""

from __future__ import annotations

import traceback
from pathlib import PurePath

MAX_FRAMES = 12  # the connector's innermost frames kept in the result file
# Files whose frames are the replay's or vLLM's engine's, never a connector's (path parts).
_HARNESS = (("kvoffload", "engine"), ("kvoffload", "vllm", "replay.py"), ("kvoffload", "vllm", "fake_worker.py"),
            ("kvoffload", "vllm", "observe.py"), ("kvoffload", "vllm", "connector_parts.py"),
            ("kvoffload", "vllm", "llm_engine.py"), ("kvoffload", "vllm", "engine.py"),
            ("kvoffload", "vllm", "pinned.py"), ("kvoffload", "vllm", "build.py"),
            ("kvoffload", "runner.py"), ("kvoffload", "gates"),
            ("vllm", "v1", "core", "sched"), ("vllm", "v1", "engine"), ("vllm", "v1", "worker"),
            ("vllm", "v1", "executor"), ("vllm", "entrypoints"), ("vllm", "utils"))
START_PREFIX = "could not start: "


def _is_harness(filename: str) -> bool:
    parts = PurePath(filename).parts
    for pattern in _HARNESS:
        size = len(pattern)
        if any(parts[i:i + size] == pattern for i in range(len(parts) - size + 1)):
            return True
    return False


def connector_frames(error: BaseException) -> list[str]:
    """``file:line in function: source`` of the connector's frames, outermost first (the
    innermost ``MAX_FRAMES``)."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not _is_harness(frame.filename)]
    return [f"{_short(frame.filename)}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
            for frame in own[-MAX_FRAMES:]]


def _short(filename: str) -> str:
    """A path from the package root on (``vllm/v1/...``, ``kvoffload/...``), else the file's name."""
    parts = PurePath(filename).parts
    for root in ("vllm", "kvoffload", "lmcache"):
        if root in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(root):])
    return PurePath(filename).name


def one_line(error: BaseException, frames: list[str]) -> str:
    message = str(error).replace("\n", " ").strip()
    if not message and frames:  # a bare assert: say which
        where, _, source = frames[-1].partition(": ")
        message = f"{source} ({where.split(' in ')[0]})" if source else where
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def record_crash(record, error: BaseException, step: int | None, *, starting: bool = False) -> None:
    """Fill ``record``'s crash fields from ``error`` (raised at ``step``; None: before the run)."""
    frames = connector_frames(error)
    text = getattr(error, "kvoffload_traceback", None) or "".join(traceback.format_exception(error))
    if not frames:  # raised in a child interpreter: its frames came back as text only
        frames = list(getattr(error, "kvoffload_frames", ()))
    message = one_line(error, frames)
    record.crash = START_PREFIX + message if starting else message
    record.crash_step = step
    record.crash_type = type(error).__name__
    record.crash_frames = frames
    record.crash_traceback = text
    record.start_failed = starting
