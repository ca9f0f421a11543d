"""Typed, validated reads of the TOML tables of a workload definition.

Every problem becomes one :class:`WorkloadError` whose message is a single line naming the file,
the key (or line, or record) and what was expected::

    workloads/x.toml: key generator.turns: expected an integer >= 1, got -3

A :class:`TableReader` hands out the keys a generator asks for and, in :meth:`TableReader.finish`,
rejects every key nobody asked for, so a typo is an error rather than a silently ignored setting.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Mapping, NoReturn, Sequence

_REQUIRED: Any = object()


class WorkloadError(ValueError):
    """Bad workload input. The message is one line: file, line or key, what was expected."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def fail(source: str, where: str, expected: str, got: object) -> NoReturn:
    """Raise the canonical error: ``{source}: {where}: expected {expected}, got {got!r}``."""
    raise WorkloadError(f"{source}: {where}: expected {expected}, got {show(got)}")


def json_problem(error: json.JSONDecodeError) -> str:
    """``Unterminated string starting at column 31`` from a JSONDecodeError."""
    return f"{error.msg.removesuffix(' at')} at column {error.colno}"


def show(value: object) -> str:
    """A short, one-line rendering of a value read from a file."""
    if isinstance(value, dict):
        return "a table" if value else "an empty table"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def require_regular_file(path: Path, display: str, expected: str) -> None:
    """A missing input, a folder, a FIFO or a device is an error before anything opens it: reading
    a FIFO waits for a writer forever, and /dev/zero never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise WorkloadError(f"{display}: no such file (expected {expected})") from None
    except OSError as exc:
        raise WorkloadError(f"{display}: cannot read the file ({exc.strerror})") from None
    except ValueError:  # a NUL byte in the name (a path read from a definition)
        raise WorkloadError(f"{display!r}: expected {expected}, got a name holding a NUL byte") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise WorkloadError(f"{display}: expected {expected}, got {kind}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or a finite float (TOML and Python's json both accept inf and nan), one that a float
    can hold (10**400 is an int to TOML and an OverflowError to ``float``)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return is_int(value) and abs(value) < 2**1023


class TableReader:
    """One TOML table; ``prefix`` is its dotted name (``"generator."``) used in messages."""

    def __init__(self, table: Mapping[str, Any], *, source: str, prefix: str = "") -> None:
        self.source = source
        self.prefix = prefix
        self._table = dict(table)
        self._read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self._table

    def keys(self) -> list[str]:
        return list(self._table)

    def where(self, key: str) -> str:
        return f"key {self.prefix}{key}"

    def fail(self, key: str, expected: str, got: object) -> NoReturn:
        fail(self.source, self.where(key), expected, got)

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        """The value as parsed by TOML; a missing required key is an error."""
        self._read.add(key)
        if key in self._table:
            return self._table[key]
        if default is _REQUIRED:
            raise WorkloadError(f"{self.source}: {self.where(key)}: required key is missing")
        return default

    def integer(self, key: str, *, minimum: int | None = None, maximum: int | None = None,
                default: Any = _REQUIRED) -> int:
        value = self.raw(key, default)
        if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            expected = "an integer" + (f" >= {minimum}" if minimum is not None else "")
            if maximum is not None:
                expected += f"{',' if minimum is not None else ''} at most {maximum:,}"
            self.fail(key, expected, value)
        return value

    def optional_integer(self, key: str, *, minimum: int, maximum: int | None = None) -> int | None:
        if self.raw(key, None) is None:
            return None
        return self.integer(key, minimum=minimum, maximum=maximum)

    def number(self, key: str, *, minimum: float | None = None, maximum: float | None = None,
               above: float | None = None, default: Any = _REQUIRED) -> float:
        """A finite float; ``minimum``/``maximum`` are inclusive bounds, ``above`` an exclusive one."""
        value = self.raw(key, default)
        ok = is_number(value)
        ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
        ok = ok and (above is None or value > above)
        if not ok:
            self.fail(key, _number_expectation(minimum, maximum, above), value)
        return float(value)

    def boolean(self, key: str, *, default: Any = _REQUIRED) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def string(self, key: str, *, choices: Sequence[str] | None = None, default: Any = _REQUIRED) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            expected = "one of " + ", ".join(repr(c) for c in choices) if choices else "a string"
            self.fail(key, expected, value)
        return value

    def table(self, key: str, *, default: Any = _REQUIRED) -> "TableReader":
        value = self.raw(key, default)
        if not isinstance(value, dict):
            self.fail(key, "a table", value)
        return TableReader(value, source=self.source, prefix=f"{self.prefix}{key}.")

    def finish(self) -> None:
        """Reject the keys nobody read (typos, settings of another generator)."""
        unknown = sorted(set(self._table) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise WorkloadError(
                f"{self.source}: {self.where(unknown[0])}: unknown key (expected one of: {known})"
            )


def _number_expectation(minimum: float | None, maximum: float | None, above: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"a finite number within [{_bound(minimum)}, {_bound(maximum)}]"
    if minimum is not None:
        return f"a finite number >= {_bound(minimum)}"
    if above is not None:
        return f"a finite number > {_bound(above)}" + (f" and <= {_bound(maximum)}" if maximum is not None else "")
    return "a finite number" + (f" <= {_bound(maximum)}" if maximum is not None else "")


def _bound(value: float) -> str:
    """67,108,864 rather than 6.71089e+07; 1e+150 stays as it is."""
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"
