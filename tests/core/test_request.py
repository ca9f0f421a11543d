"""The engine's live request: one int32 token buffer, the block hashes computed from it."""

from __future__ import annotations

from array import array

import pytest

from kvoffload.core.request import Request


@pytest.mark.parametrize("typecode", ["h", "q", "l", "b"])
def test_a_prompt_array_of_another_width_is_copied_to_int32_and_hashed_like_a_tuple(typecode):
    """Only an array("i") is shared as it is: the hashes read the buffer's bytes, so a prompt of
    16-bit (or 64-bit) tokens shared as it is would hash to other blocks than the same tokens."""
    tokens = (3, 5, 7, 11, 13, 17, 19, 23, 29)
    given = array(typecode, tokens)
    request = Request("r", given, block_size=4)
    plain = Request("p", tokens, block_size=4)
    assert request.all_token_ids.typecode == "i" and request.all_token_ids is not given
    assert request.block_hashes == plain.block_hashes and len(plain.block_hashes) == 2


def test_an_int32_prompt_is_shared_until_the_first_sample_and_never_written():
    given = array("i", range(3, 12))
    request = Request("r", given, block_size=4)
    assert request.all_token_ids is given
    request.append_tokens([40])
    assert request.all_token_ids is not given and list(given) == list(range(3, 12))
    assert len(request.block_hashes) == 2 and request.num_tokens == 10
