"""A request's script (prompt + outputs) reads exactly like the concatenated tuple, uncopied."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvoffload.engine.live import Script

tokens = st.lists(st.integers(0, 31_999), max_size=12).map(tuple)


@given(prompt=tokens.filter(bool), output=tokens, start=st.integers(-15, 15), stop=st.integers(-15, 15),
       stride=st.sampled_from([None, 1, 2, -1]))
def test_a_script_reads_like_prompt_plus_output(prompt, output, start, stop, stride):
    whole = prompt + output
    script = Script(prompt, output)
    assert len(script) == len(whole) and tuple(script) == whole
    assert script[start:stop:stride] == whole[start:stop:stride]
    assert script[start:] == whole[start:] and script[:stop] == whole[:stop]
    for index in range(-len(whole), len(whole)):
        assert script[index] == whole[index]
    assert script.as_array().tolist() == list(whole)
