"""Token ids for synthetic workloads, and the stand-in tokenizer of the ShareGPT loader.

Ids live in a 32,000-entry vocabulary (Llama-2 sized). Ids below ``FIRST_ORDINARY_ID`` are
special and never drawn at random: ``EOS_ID`` ends an answer stopped by EOS, ``USER_ID`` and
``ASSISTANT_ID`` are the two role markers of the stand-in chat template.

Random ids come from ``random.Random.randbytes``, which is repeatable for a seed on every Python
>= 3.9 and platform (the bytes are read little-endian), and costs a few tens of nanoseconds per
token, so a multi-million-token workload generates in well under a second.
"""

from __future__ import annotations

import hashlib
import random
import re
import sys
from array import array

VOCAB_SIZE = 32_000
EOS_ID = 2
USER_ID = 3
ASSISTANT_ID = 4
FIRST_ORDINARY_ID = 16
_NUM_ORDINARY = VOCAB_SIZE - FIRST_ORDINARY_ID

_TOKENIZER_KEY = b"kvoffload-bench/stand-in-tokenizer/v1"
# A token is a run of up to four letters or digits, or one other non-space character: about four
# characters of English per token, the usual rule of thumb for BPE vocabularies.
_PIECE = re.compile(r"[^\W_]{1,4}|[^\s]", re.UNICODE)


def random_tokens(rng: random.Random, count: int) -> tuple[int, ...]:
    """``count`` ordinary token ids drawn from ``rng``."""
    if count <= 0:
        return ()
    raw = array("H", rng.randbytes(2 * count))
    if sys.byteorder == "big":
        raw.byteswap()
    first, span = FIRST_ORDINARY_ID, _NUM_ORDINARY
    return tuple([first + value % span for value in raw])


def answer_tokens(rng: random.Random, count: int, *, eos: bool) -> tuple[int, ...]:
    """What the scripted model samples: ``count`` tokens, the last one EOS when ``eos``."""
    if eos:
        return random_tokens(rng, count - 1) + (EOS_ID,)
    return random_tokens(rng, count)


class StandInTokenizer:
    """A deterministic stand-in for a real tokenizer. It is NOT a real tokenizer.

    Text is cut into pieces (runs of up to four letters or digits, or single other non-space
    characters) and each piece becomes the id given by a keyed BLAKE2b hash of its UTF-8 bytes,
    folded into the ordinary id range. Equal text gives equal ids in every process, so shared
    prefixes of real conversations stay shared; token counts come out close to a BPE tokenizer's
    on English (about four characters per token) but are not those of any real model.
    """

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def encode(self, text: str) -> tuple[int, ...]:
        ids = self._ids
        out = []
        for piece in _PIECE.findall(text):
            token = ids.get(piece)
            if token is None:
                digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8, key=_TOKENIZER_KEY).digest()
                token = FIRST_ORDINARY_ID + int.from_bytes(digest, "little") % _NUM_ORDINARY
                ids[piece] = token
            out.append(token)
        return tuple(out)
