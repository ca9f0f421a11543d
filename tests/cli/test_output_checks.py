"""The output checks on hand-made paths: a path the system cannot even inspect is named as such,
an existing writable folder is accepted as it is, and a path's file system is the one of the
deepest mount holding it (how /proc, /sys and other kernel interfaces are told from disks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvoffload.cli.flags import UsageError
from kvoffload.cli.outputs import check_output_dir, check_output_file, mount_type


def test_a_path_the_system_cannot_inspect_is_named_with_the_reason(tmp_path):
    too_long = tmp_path / ("x" * 300) / "run.json"  # one name past the 255 bytes of a file name
    with pytest.raises(UsageError, match=r"run\.json: cannot inspect \(File name too long\)$"):
        check_output_file("--out", too_long)


def test_an_existing_writable_folder_is_accepted_as_it_is(tmp_path):
    (tmp_path / "earlier.json").write_text("{}")
    assert check_output_dir("--out-dir", tmp_path) == tmp_path
    assert os.listdir(tmp_path) == ["earlier.json"]


@pytest.mark.skipif(not Path("/proc/self/mountinfo").is_file(), reason="no mount table (not Linux)")
def test_a_path_is_on_the_file_system_of_the_deepest_mount_holding_it(tmp_path):
    assert mount_type("/proc/self") == "proc"  # /proc is mounted over / : the deeper mount wins
    assert mount_type("/sys/fs") == "sysfs"
    assert mount_type(os.path.realpath(tmp_path)) not in ("proc", "sysfs", None)
