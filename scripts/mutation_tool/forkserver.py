"""A pytest run per mutant without paying for torch's import each time: a server imports the
libraries once (torch, numpy, pytest; never ``kvoffload``) and forks one child per
run, which imports the mutated tree fresh and runs pytest in it.

    python forkserver.py serve SOCKET          # started by the tool, in the snapshot's environment
    python forkserver.py run SOCKET -- ARGS    # cosmic-ray's test command: pytest ARGS, exit code

Why: on a shared 2-core machine a killed mutant cost about 5 s of CPU, half of it importing
torch, numpy and pytest before the first test; the child of a fork has them already.
Nothing of the tree is imported before the fork, so each child sees the mutant (or the original)
as a fresh interpreter would: its modules are compiled from the files as they are at that moment.

One run at a time, as the tool runs mutants. The child is its own process group: when the client
goes away (cosmic-ray's timeout kills it), the server kills the group, so a hanging mutant ends
with its run. ``run`` without a server falls back to ``python -m pytest ARGS``: same verdicts,
slower.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys


def serve(path: str) -> None:
    import numpy  # noqa: F401
    import pytest
    import torch  # noqa: F401
    from _pytest.assertion import rewrite  # noqa: F401

    assert not any(name == "kvoffload" or name.startswith("kvoffload.") for name in sys.modules)
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    while True:
        connection, _ = server.accept()
        with connection:
            request = json.loads(connection.makefile("r").readline())
            pid = os.fork()
            if pid == 0:  # the child: one pytest run in the tree, its output to the client's file
                server.close()
                connection.close()
                os.setsid()
                out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.chdir(request["cwd"])
                code = 3
                try:
                    sys.argv = ["pytest", *request["args"]]
                    code = int(pytest.main(request["args"]))
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            code = _wait(pid, connection)
            try:
                connection.sendall(f"{code}\n".encode())
            except OSError:
                pass  # the client is gone (timed out): its child was killed


def _wait(pid: int, connection: socket.socket) -> int:
    """The child's exit code; if the client closes the connection first, the child's group is killed."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        readable, _, _ = select.select([connection], [], [], 0.1)
        if readable and not connection.recv(1):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return -signal.SIGKILL


def run(path: str, args: list[str]) -> int:
    out = f"{path}.{os.getpid()}.out"
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)
    except OSError:  # no server: a plain run
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *args])
    try:
        client.sendall((json.dumps({"cwd": os.getcwd(), "args": args, "out": out}) + "\n").encode())
        reply = client.makefile("r").readline()
        with open(out, errors="replace") as text:
            sys.stdout.write(text.read())
        return int(reply) if reply.strip() else 3
    finally:
        client.close()
        if os.path.exists(out):
            os.unlink(out)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        assert sys.argv[1] == "run" and sys.argv[3] == "--", sys.argv
        sys.exit(run(sys.argv[2], sys.argv[4:]))
