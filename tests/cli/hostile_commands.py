"""The hostile inputs of issue 31, as cases of ``hostile_cases.Case``: the commands and engines added
after issues 15 and 22 (``releases``, the vLLM engines' connector and model arguments, ``report``'s
release table and index pages) and the outputs of every command (a file of another kind, a hard
link). ``test_hostile_input.py`` runs them beside the older ones."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from hostile_cases import REPORT, RUN, Case, files, mooncake, result_file

# ---- issue 31: the commands and engines added since, held to run's contract ----

RELEASE_TABLE = {"schema": "kvoffload-bench/releases/v1", "hash_seed": 0, "releases": [
    {"release": "0.29.0", "preset": "vllm-0.29", "seconds": 1.0, "rows": [
        {"workload": "multi-turn-small", "scheduling": "sync", "release": {"metrics": {"crashes": 0}},
         "preset": {"metrics": {"crashes": 0}}}]}]}


def release_table(name: str = "t.json", **changes) -> Callable[[Path], None]:
    """A small release table at NAME (under the case's folder), top-level keys changed."""
    def write(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**RELEASE_TABLE, **changes}))
    return write


def report_source_with_table(**changes) -> Callable[[Path], None]:
    """A report source: one run result and a release table under src/releases/."""
    def write(folder: Path) -> None:
        result_file("src/a.json")(folder)
        release_table("src/releases/releases.json", **changes)(folder)
    return write


def hard_link(folder: Path) -> None:
    result_file("r.json")(folder)
    os.link(folder / "r.json", folder / "link.json")


def model_dir(config: str) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / "m").mkdir()
        (folder / "m" / "config.json").write_text(config)
        (folder / "m" / "model.safetensors").write_bytes(b"")
    return write


VLLM_RUN = RUN + ("--workload", "multi-turn-small", "--engine", "vllm-scheduler")
RELEASES = ("releases", "--release", "0.29.0", "--out", "{tmp}/t.json")

COMMAND_CASES = [
    Case("releases --timeout 10**20 (OverflowError in subprocess)", RELEASES + ("--timeout", "1" + "0" * 20),
         "argument --timeout: expected whole seconds from 1 to 1,000,000, got '100000000000000000000'"),
    Case("releases --timeout 0", RELEASES + ("--timeout", "0"), "argument --timeout: expected whole seconds"),
    Case("releases --workload unknown (refused in each venv after vLLM's import)", RELEASES + ("--workload", "nosuch"),
         "nosuch: unknown workload"),
    Case("releases --workload mooncake:FILE with a bad line", RELEASES + ("--workload", "mooncake:{tmp}/trace.jsonl"),
         "line 2: key timestamp: expected finite milliseconds", mooncake({"timestamp": float("nan")})),
    Case("releases --out a run result (silently replaced by a release table)", RELEASES[:3] + ("--out", "{tmp}/a.json"),
         "--out {tmp}/a.json: holds a run result (kvoffload-bench/run/v1), not a release table", result_file()),
    Case("releases --out a release table whose releases is not a list (its rows lost)", RELEASES,
         "--out {tmp}/t.json: not a release table (key releases: expected a list, got 'all')",
         release_table(releases="all")),
    Case("releases --out a release table with an unknown scheduling (ValueError in the merge)", RELEASES,
         "not a release table (releases[0].rows[0]: key scheduling: expected one of sync, async, got 'later')",
         release_table(releases=[{**RELEASE_TABLE["releases"][0], "rows": [{"workload": "w", "scheduling": "later"}]}])),
    Case("run --out a release table", RUN[:2] + ("--workload", "multi-turn-small", "--out", "{tmp}/t.json"),
         "--out {tmp}/t.json: holds a release table (kvoffload-bench/releases/v1), not a run result", release_table()),
    Case("run --out a file of notes", RUN[:2] + ("--workload", "multi-turn-small", "--out", "{tmp}/notes.txt"),
         "--out {tmp}/notes.txt: holds a file that is not a kvoffload output, not a run result",
         files(notes__txt="my notes\n")),
    Case("run --trace a run result", RUN + ("--workload", "multi-turn-small", "--trace", "{tmp}/a.json"),
         "--trace {tmp}/a.json: holds a run result (kvoffload-bench/run/v1), not a Chrome trace", result_file()),
    Case("run --trace a hard link of --out", RUN[:2] + ("--workload", "multi-turn-small", "--out", "{tmp}/r.json",
                                                       "--trace", "{tmp}/link.json"),
         "--trace {tmp}/link.json: the same file as --out {tmp}/r.json", hard_link),
    Case("gate --update --baseline a run result", ("gate", "--update", "--baseline", "{tmp}/a.json"),
         "--baseline {tmp}/a.json: holds a run result (kvoffload-bench/run/v1), not a gate baseline", result_file()),
    Case("bench --out-dir whose summary is a run result", ("bench", "--small", "--quiet", "--out-dir", "{tmp}"),
         "--out-dir {tmp}/bench-summary-small.json: holds a run result", result_file("bench-summary-small.json")),
    Case("report --out a folder whose index.md is not a report's", REPORT,
         "--out {tmp}/charts/index.md: holds a file that is not a kvoffload output, not a kvoffload report page",
         lambda folder: (result_file("src/a.json")(folder), (folder / "charts").mkdir(),
                         (folder / "charts" / "index.md").write_text("# My notes\n"))),
    Case("report: releases/releases.json cut short (refused after the charts were written)", REPORT,
         "src/releases/releases.json: not JSON (line 1: ",
         lambda folder: (result_file("src/a.json")(folder), (folder / "src" / "releases").mkdir(),
                         (folder / "src" / "releases" / "releases.json").write_text('{"schema": "kvoffload'))),
    Case("report: releases/releases.json whose provenance is a string (AttributeError)", REPORT,
         "src/releases/releases.json: not a release table (key provenance: expected an object",
         report_source_with_table(provenance="by hand")),
    Case("report: releases/releases.json with a metric that is a string", REPORT,
         "not a release table (releases[0].rows[0]: key release.metrics: crashes: expected a finite number or null",
         report_source_with_table(releases=[{**RELEASE_TABLE["releases"][0], "rows": [
             {"workload": "w", "scheduling": "sync", "release": {"metrics": {"crashes": "none"}},
              "preset": {"metrics": {}}}]}])),
    Case("--engine vllm-scheduler --connector mod: (refused after vLLM's import)", VLLM_RUN + ("--connector", "mod:"),
         "--connector expects stock, reference, simple-cpu, simple-cpu-lazy, example, peer, MODULE:CLASS, or A+B "
         "(MultiConnector), got 'mod:'"),
    Case("--engine vllm-scheduler --connector a:b:c", VLLM_RUN + ("--connector", "a:b:c"),
         "--connector expects stock, reference, simple-cpu, simple-cpu-lazy, example, peer, MODULE:CLASS, or A+B "
         "(MultiConnector), got 'a:b:c'"),
    Case("--engine vllm-scheduler --connector of a missing module", VLLM_RUN + ("--connector", "no_such_kv_module:Cls"),
         "--connector no_such_kv_module:Cls: no module 'no_such_kv_module' on the Python path"),
    Case("--engine vllm-scheduler --connector of a missing submodule", VLLM_RUN + ("--connector", "json.nosuch:Cls"),
         "--connector json.nosuch:Cls: no module 'json.nosuch' on the Python path"),
    Case("--engine vllm --model whose config.json is not JSON", RUN + ("--workload", "multi-turn-small", "--engine",
                                                                       "vllm", "--model", "{tmp}/m"),
         "--model {tmp}/m: cannot read config.json", model_dir("{not json")),
    Case("--engine vllm --connector off --preset vllm-0.29 (started the real model)",
         RUN + ("--workload", "multi-turn-small", "--engine", "vllm", "--connector", "off", "--preset", "vllm-0.29"),
         "--preset changes the reference connector, not --connector off"),
    Case("--engine vllm --connector off --disable-fix", RUN + ("--workload", "multi-turn-small", "--engine", "vllm",
                                                              "--connector", "off", "--disable-fix", "final_token_watermark"),
         "--disable-fix changes the reference connector, not --connector off"),
]
