"""Outputs under hostile conditions (issue 31): a stdout that takes ASCII only, a writer killed
by SIGKILL in the middle of a file, an existing file that is empty (ours to fill). A file of
another kind, or a hard link of another output, is refused: ``hostile_commands.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from kvoffload.cli import main
from kvoffload.results import atomic_output, remove_left_overs, write_atomic

DEFINITION = ('name = "wé"\ndescription = "a name a 7-bit terminal cannot print"\nseed = 1\n[engine]\n'
              'gpu_blocks = 256\n[generator]\nkind = "multi-turn"\nconversations = 2\nturns = 2\nprefix_len = 8\n'
              'user_len = 8\nthink_steps = 1\nconversation_gap = 1\nanswer_len = 4\n')


def test_a_non_ascii_workload_name_survives_an_ascii_only_stdout(tmp_path):
    """``PYTHONIOENCODING=ascii``: a UnicodeEncodeError traceback after the result was written,
    before issue 31; now the name is printed escaped and the run succeeds."""
    (tmp_path / "w.toml").write_text(DEFINITION)
    done = subprocess.run([sys.executable, "-m", "kvoffload.cli", "run", "--quiet", "--workload", "w.toml",
                           "--out", "r.json"], cwd=tmp_path, capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    assert done.stderr == b""
    assert done.stdout.startswith(b"workload w\\xe9 (4 requests")
    assert json.loads((tmp_path / "r.json").read_text())["workload"]["name"] == "wé"


# A writer that stops in the middle of its file and waits to be killed.
STOPPED_WRITER = """
import sys, time
from pathlib import Path
from kvoffload.results import atomic_output
with atomic_output(Path(sys.argv[1])) as handle:
    handle.write('{"half": ')
    handle.flush()
    print("writing", flush=True)
    time.sleep(600)
"""


def stopped_writer(path: Path) -> subprocess.Popen:
    writer = subprocess.Popen([sys.executable, "-c", STOPPED_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    return writer


def temporaries(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))


def test_the_temporary_file_of_a_writer_killed_by_sigkill_is_removed_by_the_next_writer(tmp_path):
    """``kill -9`` leaves the writer's ``.r.json.XXXXXXXX.tmp`` (nothing of it runs to clean up);
    before issue 31 it stayed for good. A live writer's temporary file is never touched."""
    killed, live = stopped_writer(tmp_path / "r.json"), stopped_writer(tmp_path / "r.json")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
        assert len(temporaries(tmp_path)) == 2
        write_atomic(tmp_path / "r.json", {"whole": True})
        assert json.loads((tmp_path / "r.json").read_text()) == {"whole": True}
        (held,) = temporaries(tmp_path)  # the live writer's: still its own
        assert remove_left_overs(tmp_path, ("r.json",)) == []
    finally:
        live.kill()
        live.wait(timeout=60)
    assert remove_left_overs(tmp_path, ("r.json",)) == [held]  # its writer is gone now
    assert temporaries(tmp_path) == []


def test_a_temporary_name_of_another_file_or_of_another_shape_is_not_ours_to_remove(tmp_path):
    for name in (".s.json.abcd1234.tmp", ".r.json.abcd1234.tmp.bak", ".r.json.ABCD1234.tmp", "r.json.abcd1234.tmp"):
        (tmp_path / name).write_text("")
    with atomic_output(tmp_path / "r.json") as handle:
        handle.write("{}")
    assert temporaries(tmp_path) == [".r.json.ABCD1234.tmp", ".s.json.abcd1234.tmp", "r.json.abcd1234.tmp"]


def test_an_empty_file_and_a_result_of_the_same_kind_are_replaced(tmp_path, capsys):
    """What is ours to write over: nothing (a file ``touch`` made) and a run result."""
    (tmp_path / "r.json").write_text("")
    args = ["run", "--quiet", "--workload", "multi-turn-small", "--out", str(tmp_path / "r.json")]
    assert main(args) == 0, capsys.readouterr().err
    assert main(args) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["workload"]["name"] == "multi-turn-small"


def test_a_folders_clean_up_by_name_prefix_removes_only_the_left_overs_of_names_so_begun(tmp_path):
    """A report cleans its folder by the prefixes of the names it writes (``chart-``): the
    left-overs of ``chart-a.png`` go; those of ``chart.png`` and ``index.html``, whose names do not
    begin with ``chart-``, stay, as does a live writer's."""
    for name in (".chart-a.png.abcd1234.tmp", ".chart-.abcd1234.tmp", ".chart.png.abcd1234.tmp",
                 ".chart_x.abcd1234.tmp", ".index.html.abcd1234.tmp"):
        (tmp_path / name).write_text("")
    live = stopped_writer(tmp_path / "chart-b.png")
    try:
        (held,) = [name for name in temporaries(tmp_path) if name.startswith(".chart-b.png.")]
        assert sorted(remove_left_overs(tmp_path, ("chart-",), prefix=True)) == [".chart-.abcd1234.tmp",
                                                                                ".chart-a.png.abcd1234.tmp"]
    finally:
        live.kill()
        live.wait(timeout=60)
    assert temporaries(tmp_path) == sorted([held, ".chart.png.abcd1234.tmp", ".chart_x.abcd1234.tmp",
                                            ".index.html.abcd1234.tmp"])
