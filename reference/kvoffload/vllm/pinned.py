"""Calls that must run under ``PYTHONHASHSEED=HASH_SEED``: in this process when it hashes strings
so, else in a child interpreter started with that seed.

vLLM's scheduler hands its connector the finished requests as a ``set[str]`` whose iteration
order follows the process's string hash; with a full CPU tier that order decides what is evicted
(docs/fidelity.md, "finish order"). The seed is fixed when an interpreter starts, so a replay in a
process with another seed runs in a child: the call and its arguments go to it pickled on stdin
(after the parent's ``sys.path``, so ``MODULE:CLASS`` connectors import there too), and its
progress, its result or its exception come back as pickled frames on stdout. vLLM's log lines
go to the inherited stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import traceback
from typing import Any, Callable

from kvoffload.engine.bounded import DEFAULT_STEP_BOUND_S, START_BOUND_S, ConnectorTimeout
from kvoffload.engine.set_order import HASH_SEED, process_hash_seed_is

_CHILD = ("import pickle, sys; sys.path[:] = pickle.load(sys.stdin.buffer); "
          "from kvoffload.vllm.pinned import serve; serve()")
_HEADER = struct.Struct("<Q")
_PR_SET_PDEATHSIG = 1


def call_pinned(fn: Callable[..., Any], *args: Any, on_step: Callable[[int, int], None] | None = None,
                bound_s: float | None = DEFAULT_STEP_BOUND_S) -> Any:
    """``fn(*args, on_step=...)`` under the pinned hash seed; its result or its exception.

    The child runs in a session of its own and dies with this process (``PR_SET_PDEATHSIG``),
    and is killed, with anything it started, when the call ends however it ends. It reports
    every step; ``bound_s`` is the per-step bound the call applies itself (engine/bounded.py):
    should the child send nothing for the start bound plus twice that (a hang inside a C
    extension, which no alarm interrupts), it is killed and the call raises ConnectorTimeout."""
    if process_hash_seed_is(HASH_SEED):
        return fn(*args, on_step=on_step)
    env = dict(os.environ, PYTHONHASHSEED=str(HASH_SEED))
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                             bufsize=0, start_new_session=True)
    silence = None if bound_s is None else START_BOUND_S + 2 * bound_s
    try:
        pickle.dump(list(sys.path), child.stdin)
        pickle.dump((fn, args, os.getpid()), child.stdin)
        child.stdin.close()
        while True:
            kind, payload = _read_frame(child.stdout.fileno(), silence)
            if kind == "step":
                if on_step is not None:
                    on_step(*payload)
            elif kind == "error":
                text = getattr(payload, "kvoffload_traceback", None)
                if text:
                    payload.add_note(f"raised in the replay's child interpreter:\n{text.rstrip()}")
                raise payload
            else:
                return payload
    finally:
        _end(child)


def _end(child: subprocess.Popen) -> None:
    """Kill the child and whatever it started (its session), and reap it."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()


def _read_exactly(fd: int, size: int, silence: float | None) -> bytes:
    data = b""
    while len(data) < size:
        readable, _, _ = select.select([fd], [], [], silence)
        if not readable:
            raise ConnectorTimeout(f"the replay's child interpreter sent nothing for {silence:g} s (a hang no "
                                   "per-step alarm could interrupt): killed")
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise RuntimeError(f"the replay's child interpreter (PYTHONHASHSEED={HASH_SEED}) died without a result")
        data += chunk
    return data


def _read_frame(fd: int, silence: float | None) -> tuple[str, Any]:
    header = _read_exactly(fd, _HEADER.size, silence)
    return pickle.loads(_read_exactly(fd, _HEADER.unpack(header)[0], silence))


def _die_with_parent(parent: int) -> None:
    """Linux: this process gets SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's finally still kills this child
        return
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(1)


def serve() -> None:
    """The child's side: run the call, send its progress and its outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends this child (its session gets no Ctrl-C)
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything the call prints must not corrupt the frames

    def send(kind: str, payload: Any) -> None:
        data = pickle.dumps((kind, payload))
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()

    try:
        fn, args, parent = pickle.load(sys.stdin.buffer)
        _die_with_parent(parent)
        result = fn(*args, on_step=lambda step, finished: send("step", (step, finished)))
    except Exception as error:  # noqa: BLE001 - the parent re-raises it as it is, with its traceback
        from kvoffload.engine.crashes import connector_frames

        text = "".join(traceback.format_exception(error))
        frames = connector_frames(error)
        try:
            pickle.dumps(error)
        except Exception:  # noqa: BLE001 - an exception that does not pickle comes back as its text
            error = RuntimeError(f"{type(error).__name__}: {error}")
        error.kvoffload_traceback, error.kvoffload_frames = text, frames
        send("error", error)
    else:
        send("result", result)
