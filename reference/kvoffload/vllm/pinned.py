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

import os
import pickle
import signal
import struct
import subprocess
import sys
import traceback
from typing import Any, Callable

from kvoffload.engine.set_order import HASH_SEED, process_hash_seed_is

_CHILD = ("import pickle, sys; sys.path[:] = pickle.load(sys.stdin.buffer); "
          "from kvoffload.vllm.pinned import serve; serve()")
_HEADER = struct.Struct("<Q")


def call_pinned(fn: Callable[..., Any], *args: Any, on_step: Callable[[int, int], None] | None = None) -> Any:
    """``fn(*args, on_step=...)`` under the pinned hash seed; its result or its exception."""
    if process_hash_seed_is(HASH_SEED):
        return fn(*args, on_step=on_step)
    env = dict(os.environ, PYTHONHASHSEED=str(HASH_SEED))
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        pickle.dump(list(sys.path), child.stdin)
        pickle.dump((fn, args, on_step is not None), child.stdin)
        child.stdin.close()
        while True:
            kind, payload = _read_frame(child.stdout)
            if kind == "step":
                on_step(*payload)
            elif kind == "error":
                text = getattr(payload, "kvoffload_traceback", None)
                if text:
                    payload.add_note(f"raised in the replay's child interpreter:\n{text.rstrip()}")
                raise payload
            else:
                return payload
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()


def _read_frame(stream) -> tuple[str, Any]:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise RuntimeError(f"the replay's child interpreter (PYTHONHASHSEED={HASH_SEED}) died without a result")
    return pickle.loads(stream.read(_HEADER.unpack(header)[0]))


def serve() -> None:
    """The child's side: run the call, send its progress and its outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which ends this child
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything the call prints must not corrupt the frames

    def send(kind: str, payload: Any) -> None:
        data = pickle.dumps((kind, payload))
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()

    try:
        fn, args, wants_steps = pickle.load(sys.stdin.buffer)
        result = fn(*args, on_step=(lambda step, finished: send("step", (step, finished))) if wants_steps else None)
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
