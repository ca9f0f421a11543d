"""vLLM's warnings held back until a vLLM replay is under way, so a refusal is the only line.

vLLM writes warnings to stderr while it is imported and while a replay is built (Triton's
"Disabling Triton" on a CPU, the connector's "Initializing ..."); a connector vLLM cannot load is
refused only after them, so the user saw two lines or more where the contract is one
(``kvoffload.cli``: bad input is one line). :class:`StderrHold` redirects file descriptor 2 (this
process's, and the child interpreter's that a replay may run in) into a temporary file until the
replay's first step, then writes what it held and lets stderr through. A refusal (bad input) or
a Ctrl-C before that drops what it held; any other failure shows it (it may say why).
"""

from __future__ import annotations

import os
import sys
import tempfile


class StderrHold:
    """``with StderrHold(drop_on=(ConfigError, ...)) as hold: ... hold.release() ...``"""

    def __init__(self, drop_on: tuple[type[BaseException], ...]) -> None:
        self._drop_on = drop_on
        self._saved: int | None = None
        self._held = None

    def __enter__(self) -> "StderrHold":
        sys.stderr.flush()
        self._held = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._held.fileno(), 2)
        return self

    def release(self, show: bool = True) -> None:
        """stderr back to where it was, and (``show``) what was held written to it; once."""
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._saved = None
        if show:
            self._held.seek(0)
            text = self._held.read()
            if text:
                os.write(2, text)
        self._held.close()

    def __exit__(self, kind, error, traceback) -> None:
        self.release(show=not (kind is not None and issubclass(kind, (KeyboardInterrupt, *self._drop_on))))
