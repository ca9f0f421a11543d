"""Integers too long to read: one line naming where, instead of a traceback.

CPython (3.11, and 3.10.7 on) refuses to convert a decimal string of more than
``sys.get_int_max_str_digits()`` digits (4,300 unless changed) to an ``int``: the conversion
takes time quadratic in the length, so the limit guards against input that would stall a parser
(CVE-2020-10735). ``json.loads``, ``tomllib.loads`` and ``int(text)`` then raise a bare
``ValueError`` that names no file and no line. The limit is kept, not lifted: every reader here
catches that error and says where the number is (:func:`describe`).

No quantity of this project needs more than a few dozen digits, so a number this long is always
bad input, never a value to accept.
"""

from __future__ import annotations

import re
import sys

# 0 (or an interpreter without the limit) means every length is read.
DIGIT_LIMIT: int = getattr(sys, "get_int_max_str_digits", lambda: 0)()


def is_too_long(error: BaseException) -> bool:
    """Whether ``error`` is the interpreter refusing a decimal string for its length."""
    return isinstance(error, ValueError) and "integer string conversion" in str(error)


# What a message says was expected: ``f"expected {EXPECTED}, got {describe(text)}"``.
EXPECTED = f"integers of at most {DIGIT_LIMIT or 4300:,} digits"


def describe(text: str | bytes, *, line: bool = True) -> str:
    """``"an integer of 5,000 digits at line 3"``: the first run of digits in ``text`` longer than
    the limit (one JSON or TOML document; a run inside a string may be named in its place, which
    still points at the line to look at). ``line``: add the line number (not for one line)."""
    pattern = r"\d{%d,}" % ((DIGIT_LIMIT or 4300) + 1)
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    match = re.search(pattern, text)
    if match is None:
        return "an integer too long to read"
    where = f" at line {text.count(chr(10), 0, match.start()) + 1}" if line else ""
    return f"an integer of {len(match.group()):,} digits{where}"


def digits_message(text: str) -> str:
    """The end of a message about ``text``, a decimal string ``int`` refused for its length."""
    return f"an integer of at most {DIGIT_LIMIT or 4300:,} digits, got {len(text.strip()):,} digits"
