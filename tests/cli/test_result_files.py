"""A file is replaced whole or not at all (docs/commands.md, "Whole or not at all")."""

from __future__ import annotations

import os

import pytest

from kvoffload.results import atomic_output


@pytest.mark.parametrize("stop", [KeyboardInterrupt, ValueError])
def test_a_writer_stopped_midway_leaves_the_old_file_and_no_temporary_one(stop, tmp_path):
    # Ctrl-C (KeyboardInterrupt is no Exception) or a failure while the new result is half
    # written: the old result stays as it was, and the half-written temporary file is gone.
    (tmp_path / "r.json").write_text('{"old": 1}')
    with pytest.raises(stop):
        with atomic_output(tmp_path / "r.json") as handle:
            handle.write('{"new": ')
            handle.flush()
            raise stop()
    assert os.listdir(tmp_path) == ["r.json"]
    assert (tmp_path / "r.json").read_text() == '{"old": 1}'
