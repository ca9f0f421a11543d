"""The hostile inputs of issues 15 and 22 (those of issue 31 are in ``hostile_commands.py``), as
cases: the files each builds in a fresh folder, the command it runs, and the words its one-line
error must hold. ``test_hostile_input.py`` runs them (this folder is on ``sys.path``: conftest.py).

``python tests/cli/hostile_cases.py`` prints the cases as a table: class, command, exit, message
(the closing table of issue 15).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
# Hang bounds, not speed targets: the failures guarded against took 82 s to forever, while a
# rejection takes milliseconds; the bounds leave room for a 2-core machine shared with other work
# (20 s was exceeded once at load 11). A case in its own process also pays for importing torch.
SECONDS = 60
PROCESS_SECONDS = 110

MOONCAKE_LINE = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}
SHAREGPT = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]


def mooncake(*changes: dict, raw_tail: str = "") -> Callable[[Path], None]:
    """A trace: one good line, then one line per change (the good line with the change applied)."""
    def write(folder: Path) -> None:
        lines = [json.dumps(MOONCAKE_LINE)]
        for change in changes:
            line = {**MOONCAKE_LINE, **change}
            lines.append(json.dumps(line))  # json.dumps writes NaN and Infinity as Python reads them
        (folder / "trace.jsonl").write_text("\n".join(lines) + "\n" + raw_tail)
    return write


def toml(generator: str, engine: str = "gpu_blocks = 256\n") -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / "w.toml").write_text(f'name = "w"\ndescription = "hostile"\nseed = 1\n[engine]\n{engine}'
                                       f'[generator]\n{generator}')
    return write


MULTI_TURN = ('kind = "multi-turn"\nconversations = 2\nturns = 2\nprefix_len = 8\nuser_len = 8\n'
              'think_steps = 1\nconversation_gap = 1\n')


def multi_turn(**keys: str) -> Callable[[Path], None]:
    """The small multi-turn definition with ``answer_len`` and other keys set as given."""
    body = MULTI_TURN
    for key, value in keys.items():
        if f"{key} = " in body:
            body = "\n".join(line for line in body.splitlines() if not line.startswith(f"{key} = ")) + "\n"
        body += f"{key} = {value}\n"
    if "answer_len" not in keys:
        body += "answer_len = 4\n"
    return toml(body)


def files(**contents: bytes | str) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        for name, content in contents.items():
            path = folder / name.replace("__", ".")
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return write


def special(kind: str) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        if kind == "fifo":
            os.mkfifo(folder / "out.json")
        elif kind == "symlink":
            (folder / "real.json").write_text("{}")
            (folder / "out.json").symlink_to(folder / "real.json")
        elif kind == "file-as-folder":
            (folder / "notresult.json").write_text("{}")
    return make


@dataclass(frozen=True)
class Case:
    name: str  # the class of issue 15
    argv: tuple[str, ...]  # {tmp} stands for the case's folder
    message: str  # a part of the one line
    setup: Callable[[Path], None] = field(default=lambda folder: None)
    subprocess: bool = False

    def command(self, folder: Path) -> list[str]:
        return [part.replace("{tmp}", str(folder)) for part in self.argv]


RUN = ("run", "--quiet", "--out", "{tmp}/r.json")
REPORT = ("report", "--from", "{tmp}/src", "--out", "{tmp}/charts")


def asv_source(name: str, content: bytes | str) -> Callable[[Path], None]:
    """A report source whose asv folder holds NAME (under ``src/asv/``) as CONTENT: bytes, or one of
    "fifo", "directory", "dangling" (a symbolic link to nothing)."""
    def make(folder: Path) -> None:
        path = folder / "src" / "asv" / name
        path.parent.mkdir(parents=True)
        if content == "fifo":
            os.mkfifo(path)
        elif content == "directory":
            path.mkdir()
        elif content == "dangling":
            path.symlink_to(folder / "nowhere.json")
        else:
            path.write_bytes(content)
    return make
NESTED = "[" * 200_000 + "]" * 200_000
# A number past CPython's 4,300-digit limit on int(str) (sys.get_int_max_str_digits): json.loads
# and tomllib raised a bare ValueError (issue 22).
HUGE = "7" * 5000
RESULT = REPO / "results" / "runs" / "bench-multi-turn-reference.json"
ASV_RESULT = next(path for path in sorted((REPO / "results" / "asv").glob("*/*.json")) if path.name != "machine.json")


def result_file(name: str = "a.json", *, raw: "Callable[[str], str] | None" = None,
                **changes) -> Callable[[Path], None]:
    """A copy of a bundled run result with top-level keys changed, or its text rewritten by ``raw``."""
    def write(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = RESULT.read_text()
        if changes:
            text = json.dumps({**json.loads(text), **changes})
        path.write_text(raw(text) if raw else text)
    return write


def asv_date(date: str) -> Callable[[Path], None]:
    """A report source whose one asv result file has ``date`` (JSON text) as its commit date."""
    def write(folder: Path) -> None:
        data = json.loads(ASV_RESULT.read_text())
        data["date"] = "DATE"
        asv_source("m/x.json", json.dumps(data).replace('"DATE"', date).encode())(folder)
    return write


# A relative folder path of 4,080 bytes: a result DEEP/r.json (4,087) fits PATH_MAX (4,096 with the
# final NUL), the temporary file written beside it (DEEP/.r.json.XXXXXXXX.tmp, 4,101) does not.
DEEP = "/".join(["d" * 200] * 20) + "/" + "e" * 60


CASES = [
    Case("Mooncake timestamp NaN", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "line 2: key timestamp: expected finite milliseconds", mooncake({"timestamp": float("nan")})),
    Case("Mooncake timestamp Infinity", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "line 2: key timestamp: expected finite milliseconds", mooncake({"timestamp": float("inf")})),
    Case("Mooncake timestamp NaN (workloads show)", ("workloads", "show", "mooncake:{tmp}/trace.jsonl"),
         "line 2: key timestamp", mooncake({"timestamp": float("nan")})),
    Case("Mooncake timestamp 1e308", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "within [0, 2**53], got 1e+308", mooncake({"timestamp": 1e308})),
    Case("Mooncake output_length 1e12", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "line 2: expected prompt + output within max_model_len", mooncake({"output_length": 10**12})),
    Case("Mooncake output_length 1e8", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "line 2: expected prompt + output within max_model_len", mooncake({"output_length": 10**8})),
    Case("Mooncake 200,000 nested [] in an unused key", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "line 2: expected a JSON object, got JSON nested deeper than 64 levels",
         mooncake(raw_tail=json.dumps(MOONCAKE_LINE)[:-1] + ', "extra": ' + NESTED + "}\n")),
    Case("ShareGPT 200,000 nested brackets", RUN + ("--workload", "sharegpt:{tmp}/chat.json"),
         "nested deeper than 64 levels", files(chat__json=NESTED), subprocess=True),
    Case("ShareGPT file that is a bare null (pyarrow crashed the process: found by the fuzz harness)",
         RUN + ("--workload", "sharegpt:{tmp}/chat.json"), "expected a JSON array of conversation records or one "
         "record per line, got 'null'", files(chat__json="null"), subprocess=True),
    Case("ShareGPT binary file", RUN + ("--workload", "sharegpt:{tmp}/chat.json"),
         "chat.json: line 2: expected UTF-8 JSON text, got undecodable bytes",
         files(chat__json=bytes(range(256)) * 64)),
    Case("ShareGPT JSONL broken on line 2 (datasets fails: its log stays silent)",
         RUN + ("--workload", "sharegpt:{tmp}/chat.json"), "chat.json: line 2: expected one JSON record per line",
         files(chat__json='{"id": 1}\n{"id": \n'), subprocess=True),
    Case("ShareGPT text that is not JSON", RUN + ("--workload", "sharegpt:{tmp}/chat.json"),
         "expected a JSON array of conversation records or one record per line, got 'hello world",
         files(chat__json="hello world\nnot json\n")),
    Case("TOML 200,000 nested [] in an unused key", RUN + ("--workload", "{tmp}/w.toml"),
         "nested too deeply", toml(MULTI_TURN + "answer_len = 4\nx = " + NESTED + "\n")),
    Case("TOML lognormal mean = inf", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.answer_len.mean: expected a finite number",
         multi_turn(answer_len='{dist = "lognormal", mean = inf, sigma = 1}')),
    Case("TOML lognormal sigma = inf", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.answer_len.sigma: expected a finite number",
         multi_turn(answer_len='{dist = "lognormal", mean = 5, sigma = inf}')),
    Case("TOML Poisson mean = inf", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.think_steps.mean: expected a finite number",
         multi_turn(think_steps='{dist = "poisson", mean = inf}')),
    Case("TOML Poisson mean = 1e18 (a gap)", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.conversation_gap.mean: expected a finite number within [0, 9,007,199,254,740,992]",
         multi_turn(conversation_gap='{dist = "poisson", mean = 1e18}')),
    Case("TOML Zipf alpha just above 1, no max", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.answer_len: expected draws of at most 67,108,864",
         multi_turn(answer_len='{dist = "zipf", alpha = 1.000001}')),
    Case("TOML Zipf alpha 1 + 1e-17 (1.0 as a float)", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.answer_len.alpha: expected a finite number > 1 and <= 1,000",
         multi_turn(answer_len='{dist = "zipf", alpha = 1.00000000000000001}')),
    Case("TOML 1e8 conversations", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.conversations: expected an integer >= 1, at most 10,000,000",
         multi_turn(conversations="100_000_000")),
    Case("TOML ms_per_step = 1e-300", RUN + ("--workload", "{tmp}/w.toml"),
         "line 2: key timestamp: expected an arrival step",
         lambda folder: (mooncake({"timestamp": 5})(folder),
                         toml('kind = "mooncake"\npath = "trace.jsonl"\nms_per_step = 1e-300\n')(folder))),
    Case("TOML Zipf alpha = 1e18 (2**(alpha - 1) overflowed: found by the fuzz harness)",
         RUN + ("--workload", "{tmp}/w.toml"), "key generator.answer_len.alpha: expected a finite number > 1 and "
         "<= 1,000, got 1e+18", multi_turn(answer_len='{dist = "zipf", alpha = 1e18}')),
    Case("Mooncake trace that is a FIFO (reading it waited forever)",
         RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"), "trace.jsonl: expected a Mooncake JSONL trace, got not "
         "a regular file", lambda folder: os.mkfifo(folder / "trace.jsonl")),
    Case("compare a FIFO", ("compare", "{tmp}/a.json", "{tmp}/a.json"), "a.json: not a regular file",
         lambda folder: os.mkfifo(folder / "a.json")),
    Case("TOML ms_per_step = inf (every arrival would collapse to step 0)", RUN + ("--workload", "{tmp}/w.toml"),
         "key generator.ms_per_step: expected a finite number > 0, got inf",
         lambda folder: (mooncake({"timestamp": 5})(folder),
                         toml('kind = "mooncake"\npath = "trace.jsonl"\nms_per_step = inf\n')(folder))),
    Case("--set gpu_blocks=auto with a 10**9-token answer (random token generation overflowed)",
         RUN + ("--workload", "{tmp}/w.toml", "--set", "gpu_blocks=auto"),
         "key generator.answer_len: expected an integer at most 67,108,864", multi_turn(answer_len="1000000000")),
    Case("--set gpu_blocks=99999999999999999999", RUN + ("--workload", "multi-turn-small",
                                                         "--set", "gpu_blocks=99999999999999999999"),
         "with --set gpu_blocks=99999999999999999999: the KV tiers (gpu_blocks 99,999,999,999,999,999,999"),
    Case("--set block_size=10**100 (the memory message overflowed a float: found by the fuzz harness)",
         RUN + ("--workload", "multi-turn-small", "--set", "block_size=1" + "0" * 100),
         "block_size 10,000,000,000,"),
    Case("--set workers=10**12", RUN + ("--workload", "multi-turn-small", "--set", "workers=1000000000000"),
         "workers: expected at most 1024"),
    Case("--out under a file", ("run", "--quiet", "--workload", "multi-turn-small", "--out",
                                "{tmp}/notresult.json/x.json"),
         "notresult.json is not a directory", special("file-as-folder")),
    Case("--out a FIFO", RUN[:2] + ("--workload", "multi-turn-small", "--out", "{tmp}/out.json"),
         "is a FIFO; expected a regular file", special("fifo")),
    Case("--out a symlink", RUN[:2] + ("--workload", "multi-turn-small", "--out", "{tmp}/out.json"),
         "is a symbolic link; expected a regular file", special("symlink")),
    Case("--out a device node", ("run", "--quiet", "--workload", "multi-turn-small", "--out", "/dev/null"),
         "/dev/null: is a character device"),
    Case("--out X --trace X", RUN + ("--workload", "multi-turn-small", "--trace", "{tmp}/r.json"),
         "--trace {tmp}/r.json: the same file as --out {tmp}/r.json"),
    Case("report --out FILE", ("report", "--from", str(REPO / "results"), "--out", "{tmp}/notresult.json"),
         "--out {tmp}/notresult.json: is a regular file; expected a directory", special("file-as-folder")),
    Case("report --from a folder with deeply nested JSON (not a run result: passed over)",
         REPORT, "src: no result files",
         lambda folder: ((folder / "src" / "asv" / "m").mkdir(parents=True),
                         (folder / "src" / "deep.json").write_text(NESTED))),
    Case("report: an asv result file that is a FIFO", REPORT,
         "src/asv/m/x.json: a FIFO; expected an asv result file", asv_source("m/x.json", "fifo")),
    Case("report: an asv result file that is a directory", REPORT,
         "src/asv/m/x.json: a directory; expected an asv result file", asv_source("m/x.json", "directory")),
    Case("report: an asv result file cut short", REPORT,
         "src/asv/m/x.json: not JSON (line 1: ", asv_source("m/x.json", b'{"commit_hash": "ab')),
    Case("report: an asv result file that is not UTF-8", REPORT,
         "src/asv/m/x.json: expected UTF-8 JSON text (an asv result file), got undecodable bytes at byte 0",
         asv_source("m/x.json", b"\xff\xfe{}")),
    Case("report: an asv result file of another layout", REPORT,
         "src/asv/m/x.json: not an asv result file (KeyError: 'result_columns')", asv_source("m/x.json", b"{}")),
    Case("report: asv's benchmarks.json a FIFO (reading it waited forever)", REPORT,
         "src/asv/benchmarks.json: a FIFO; expected asv's benchmarks.json", asv_source("benchmarks.json", "fifo")),
    Case("report: asv's benchmarks.json a directory", REPORT,
         "src/asv/benchmarks.json: a directory; expected asv's benchmarks.json",
         asv_source("benchmarks.json", "directory")),
    Case("report: asv's benchmarks.json a dangling symbolic link", REPORT,
         "src/asv/benchmarks.json: cannot read (No such file or directory)", asv_source("benchmarks.json", "dangling")),
    Case("report: asv's benchmarks.json cut short", REPORT,
         "src/asv/benchmarks.json: not JSON (line 1: ", asv_source("benchmarks.json", b'{"bench": {"unit"')),
    Case("report: asv's benchmarks.json not UTF-8", REPORT,
         "src/asv/benchmarks.json: expected UTF-8 JSON text", asv_source("benchmarks.json", bytes(range(128, 256)))),
    Case("report: asv's benchmarks.json a JSON array", REPORT,
         "src/asv/benchmarks.json: expected a JSON object of benchmarks, got list", asv_source("benchmarks.json", b"[]")),
    Case("report: asv results folder that is a file", REPORT,
         "src/asv: not a directory", lambda folder: ((folder / "src").mkdir(), (folder / "src" / "asv").write_text("x"))),
    Case("compare a directory", ("compare", "{tmp}/a.json", "{tmp}/a.json"), "a.json: not a regular file",
         lambda folder: (folder / "a.json").mkdir()),
    Case("compare a file that is not UTF-8", ("compare", "{tmp}/a.json", "{tmp}/a.json"),
         "a.json: cannot read ('utf-8' codec can't decode", files(a__json=b"\xff\xfe{}")),
    Case("compare a result cut short", ("compare", "{tmp}/a.json", "{tmp}/a.json"), "a.json: not JSON (line 1: ",
         files(a__json='{"schema": "kvoffload')),
    Case("gate --baseline a FIFO", ("gate", "--baseline", "{tmp}/b.json"),
         "--baseline {tmp}/b.json: a FIFO; expected a gate baseline file or a git ref",
         lambda folder: os.mkfifo(folder / "b.json")),
    Case("gate --baseline a directory", ("gate", "--baseline", "{tmp}/b.json"),
         "--baseline {tmp}/b.json: a directory; expected a gate baseline file or a git ref",
         lambda folder: (folder / "b.json").mkdir()),
    Case("gate --baseline a file that is not UTF-8", ("gate", "--baseline", "{tmp}/b.json"),
         "b.json: expected UTF-8 JSON text (a gate baseline)", files(b__json=b"\xff\xfe{}")),
    Case("gate --baseline a baseline cut short", ("gate", "--baseline", "{tmp}/b.json"), "b.json: not JSON (",
         files(b__json='{"schema": "kvoffload')),
    Case("gate --baseline nested 200,000 deep", ("gate", "--baseline", "{tmp}/b.json"),
         "b.json: not a gate baseline (JSON nested too deeply)", files(b__json=NESTED)),
    Case("bench --out-dir FILE", ("bench", "--small", "--quiet", "--out-dir", "{tmp}/notresult.json"),
         "--out-dir {tmp}/notresult.json: is a regular file; expected a directory", special("file-as-folder")),
    # ---- issue 22: integers past 4,300 digits, sizes past a float, unchecked result files ----
    Case("Mooncake input_length of 5,000 digits", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "trace.jsonl: line 2: expected integers of at most 4,300 digits, got an integer of 5,000 digits",
         mooncake(raw_tail=f'{{"timestamp": 0, "input_length": {HUGE}, "output_length": 1, "hash_ids": [1]}}\n')),
    Case("Mooncake hash id of 5,000 digits", RUN + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "trace.jsonl: line 2: expected integers of at most 4,300 digits, got an integer of 5,000 digits",
         mooncake(raw_tail=f'{{"timestamp": 0, "input_length": 2, "output_length": 1, "hash_ids": [{HUGE}]}}\n')),
    Case("Mooncake timestamp of 5,000 digits (workloads show)", ("workloads", "show", "mooncake:{tmp}/trace.jsonl"),
         "trace.jsonl: line 2: expected integers of at most 4,300 digits, got an integer of 5,000 digits",
         mooncake(raw_tail=f'{{"timestamp": {HUGE}, "input_length": 2, "output_length": 1, "hash_ids": [1]}}\n')),
    Case("ShareGPT id of 5,000 digits", RUN + ("--workload", "sharegpt:{tmp}/chat.json"),
         "chat.json: expected integers of at most 4,300 digits, got an integer of 5,000 digits at line 1",
         files(chat__json=json.dumps([{**SHAREGPT[0], "id": 1}]).replace('"id": 1', f'"id": {HUGE}')),
         subprocess=True),
    Case("TOML seed of 5,000 digits", RUN + ("--workload", "{tmp}/w.toml"),
         "w.toml: expected integers of at most 4,300 digits, got an integer of 5,000 digits at line 3",
         lambda folder: (folder / "w.toml").write_text(f'name = "w"\ndescription = "d"\nseed = {HUGE}\n'
                                                     f'[generator]\n{MULTI_TURN}answer_len = 4\n')),
    Case("compare a result with a metric of 5,000 digits", ("compare", "{tmp}/a.json", "{tmp}/a.json"),
         "a.json: expected integers of at most 4,300 digits, got an integer of 5,000 digits at line",
         result_file(raw=lambda text: text.replace('"steps": ', f'"steps": {HUGE}, "was": ', 1))),
    Case("compare a result whose provenance is a string", ("compare", "{tmp}/a.json", "{tmp}/a.json"),
         "a.json: key provenance: expected an object or null, got 'by hand'", result_file(provenance="by hand")),
    Case("compare a result whose metric is a float no float holds (10**400)",
         ("compare", "{tmp}/a.json", "{tmp}/a.json"), "a.json: key metrics.steps: expected a finite number or null",
         result_file(raw=lambda text: text.replace('"steps": ', '"steps": 1' + "0" * 400 + ', "was": ', 1))),
    Case("compare a result whose connector.disabled is a string", ("compare", "{tmp}/a.json", "{tmp}/a.json"),
         "a.json: key connector.disabled: expected a list of fix names, got 'all'",
         result_file(raw=lambda text: text.replace('"disabled": []', '"disabled": "all"', 1))),
    Case("compare a result whose connector.label is a number", ("compare", "{tmp}/a.json", "{tmp}/a.json"),
         "a.json: key connector.label: expected a string, got 5",
         result_file(raw=lambda text: json.dumps({**json.loads(text),
                                                  "connector": {**json.loads(text)["connector"], "label": 5}}))),
    Case("report: the only result's provenance is a string (AttributeError)", REPORT,
         "src: no readable result files (1 ignored; the first: {tmp}/src/a.json: key provenance: expected an object "
         "or null, got 'by hand')", result_file("src/a.json", provenance="by hand")),
    Case("report: an asv date of 5,000 digits", REPORT,
         "src/asv/m/x.json: expected integers of at most 4,300 digits (an asv result file), got an integer of 5,000",
         asv_date(HUGE)),
    Case("report: an asv date Infinity (int() raised OverflowError)", REPORT,
         "src/asv/m/x.json: not an asv result file (ValueError: key date: expected ms since the epoch, got inf)",
         asv_date("Infinity")),
    Case("--set cpu_chunks=1e999GiB (OverflowError)", RUN + ("--workload", "multi-turn-small",
                                                          "--set", "cpu_chunks=1e999GiB"),
         "--set cpu_chunks=1e999GiB: expected a size a float holds (at most 1e308 bytes), got 1e999 GiB"),
    Case("--set gpu_blocks of 5,000 digits", RUN + ("--workload", "multi-turn-small", "--set", f"gpu_blocks={HUGE}"),
         "gpu_blocks expects an integer of at most 4,300 digits, got 5,000 digits"),
    Case("--set gpu_blocks=auto with a 2**26-token Mooncake request (the pool grew past 5 GiB)",
         RUN + ("--workload", "mooncake:{tmp}/trace.jsonl", "--set", "gpu_blocks=auto"),
         "trace.jsonl: line 2: expected prompt + output of at most 67,108,848 tokens (a gpu_blocks=auto pool "
         "holds at most 2**26 token slots, the null block and one step's drafts included), got 67,108,863 + 1 tokens",
         mooncake({"input_length": 2**26 - 1, "output_length": 1, "hash_ids": list(range(2**26 // 512))})),
    # ---- issue 22: outputs refused only after the replay ----
    Case("--out under /proc", RUN[:2] + ("--workload", "multi-turn-small", "--out", "/proc/r.json"),
         "--out /proc/r.json: /proc is in /proc, the kernel's interface, not a place for files"),
    Case("--out under /sys", RUN[:2] + ("--workload", "multi-turn-small", "--out", "/sys/kernel/r.json"),
         "--out /sys/kernel/r.json: /sys/kernel is in /sys, the kernel's interface, not a place for files"),
    Case("report --out under /proc", ("report", "--from", str(REPO / "results"), "--out", "/proc/charts"),
         "--out /proc/charts: /proc is in /proc"),
    Case("--preset A --preset B", RUN + ("--preset", "vllm-0.25", "--preset", "vllm-0.26"),
         "argument --preset: given twice (vllm-0.25 and vllm-0.26)"),
    Case("--preset vllm-0.25 --disable-fix last_block_at_finish",
         RUN + ("--preset", "vllm-0.25", "--disable-fix", "last_block_at_finish"),
         "--disable-fix last_block_at_finish: preset vllm-0.25 already lacks this fix"),
    Case("--scheduling async --set scheduling=sync", RUN + ("--scheduling", "async", "--set", "scheduling=sync"),
         "--scheduling async and --set scheduling=sync"),
    Case("--set KEY twice", RUN + ("--set", "cpu_chunks=4", "--set", "cpu_chunks=8"),
         "--set cpu_chunks given twice"),
]


if __name__ == "__main__":  # the closing table of issue 15
    import tempfile
    from contextlib import redirect_stderr
    from io import StringIO

    from kvoffload.cli import main

    from hostile_commands import COMMAND_CASES

    print("| class | command | exit | message |\n|---|---|---|---|")
    for case in CASES + COMMAND_CASES:
        with tempfile.TemporaryDirectory() as folder:
            os.chdir(folder)
            case.setup(Path(folder))
            argv = case.command(Path(folder))
            if case.subprocess:
                done = subprocess.run([sys.executable, "-m", "kvoffload.cli", *argv], capture_output=True,
                                      text=True, cwd=folder, timeout=120)
                code, err = done.returncode, done.stderr
            else:
                buffer = StringIO()
                with redirect_stderr(buffer):
                    code = main(argv)
                err = buffer.getvalue()
            shown = " ".join(argv).replace(folder, "$D")
            shown = shown if len(shown) < 90 else shown[:87] + "..."
            message = err.strip().replace(folder, "$D").replace("|", "\\|")
            print(f"| {case.name} | `kvoffload {shown}` | {code} | {message} |")
            os.chdir(REPO)
