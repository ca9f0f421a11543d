"""Token ids for synthetic workloads, and the stand-in tokenizer of the ShareGPT loader.

Ids live in a 32,000-entry vocabulary (Llama-2 sized). Ids below ``FIRST_ORDINARY_ID`` are
special and never drawn at random: ``EOS_ID`` ends an answer stopped by EOS, ``USER_ID`` and
``ASSISTANT_ID`` are the two role markers of the stand-in chat template.

Random ids come from ``random.Random.randbytes``, which is repeatable for a seed on every Python
>= 3.9 and platform (the bytes are read little-endian), and costs a few nanoseconds per token.
The synthetic generators and the trace loaders hold token ids as compact ``array("i")`` buffers
(4 bytes a token, no int objects; ``random_tokens``), which a live request shares and hashes as
they are. The stand-in tokenizer returns tuples made of the shared int objects of ``_TOKEN_IDS``:
a token costs one 8-byte pointer, not a fresh 28-byte int.
"""

from __future__ import annotations

import hashlib
import random
import re
from array import array
from operator import itemgetter

import numpy as np

from kvoffload.core.types import TOKEN_TYPECODE

VOCAB_SIZE = 32_000
EOS_ID = 2
USER_ID = 3
ASSISTANT_ID = 4
FIRST_ORDINARY_ID = 16
_NUM_ORDINARY = VOCAB_SIZE - FIRST_ORDINARY_ID
_TOKEN_IDS = tuple(range(VOCAB_SIZE))  # the one int object per id that every token tuple points to

_TOKENIZER_KEY = b"kvoffload-bench/stand-in-tokenizer/v1"
# A token is a run of up to four letters or digits, or one other non-space character: about four
# characters of English per token, the usual rule of thumb for BPE vocabularies.
_PIECE = re.compile(r"[^\W_]{1,4}|[^\s]", re.UNICODE)


def random_tokens(rng: random.Random, count: int) -> array:
    """``count`` ordinary token ids drawn from ``rng``, as a compact ``array("i")`` (4 bytes a
    token): the engine's live requests hash and share this buffer without converting it."""
    out = array(TOKEN_TYPECODE)
    if count > 0:
        out.frombytes(_random_ids(rng, count).astype(np.int32).tobytes())
    return out


def _random_ids(rng: random.Random, count: int) -> np.ndarray:
    raw = np.frombuffer(rng.randbytes(2 * count), dtype="<u2")
    return raw % _NUM_ORDINARY + FIRST_ORDINARY_ID


def shared_ids(ids: list[int]) -> tuple[int, ...]:
    """``tuple(ids)`` made of the shared int objects (ids must be in ``[0, VOCAB_SIZE)``)."""
    if len(ids) == 1:
        return (_TOKEN_IDS[ids[0]],)
    return itemgetter(*ids)(_TOKEN_IDS) if ids else ()


def answer_tokens(rng: random.Random, count: int, *, eos: bool) -> array:
    """What the scripted model samples: ``count`` tokens, the last one EOS when ``eos``."""
    if eos:
        return random_tokens(rng, count - 1) + array(TOKEN_TYPECODE, (EOS_ID,))
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
        return shared_ids(out)
