"""asv in an ``existing`` environment (an interpreter with vLLM), its results made this project's.

    python scripts/asv_existing.py config WORK
    python scripts/asv_existing.py adopt WORK_RESULTS RESULTS MACHINE SHA PYTHON
    python scripts/asv_existing.py commit RESULTS

``benchmarks/record-real-model`` and ``scripts/gpu-runner`` both run the suite with
``asv run -E existing:PYTHON --set-commit-hash SHA``; this is what they share, one owner:

- ``config``: ``WORK/asv.conf.json``, asv.conf.json with every folder absolute (asv changes into the
  config's folder before it resolves anything: a relative interpreter or folder there is resolved
  against WORK, and ``-E existing:.venv-vllm/bin/python`` then selects no environment at all, asv's
  "No environments selected", exit 1). Results go to ``WORK/results``.
- ``adopt``: asv names an existing environment after its interpreter's path and writes that path
  into the result; the result becomes ``RESULTS/MACHINE/<sha8>-existing-vllm.json`` (or
  ``-existing-python`` for an interpreter without vLLM), ``env_name`` that name, with the
  environment's Python and vLLM versions in place of the path: one line per machine wherever the
  clone lives, and no path of the recording machine in the file. ``RESULTS/benchmarks.json`` gains
  the recorded benchmarks' entries (units, versions), and ``RESULTS/MACHINE/machine.json`` the
  machine's description where it has none yet.
- ``commit``: a GPU runner's adopted results (``<out>/results``, machine folders inside) copied into
  this checkout's ``results/asv/`` and committed, ``results/asv`` only; refused (one line, exit 2)
  when a machine's committed ``machine.json`` describes other hardware (``asv_machine.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from asv_machine import same_hardware, shown  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def write_json(path: Path, data: dict, **dump) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, **dump) + ("\n" if dump.get("indent") else ""))
    os.replace(tmp, path)


def config(work: Path) -> int:
    from asv import util

    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(work / "results"),
                html_dir=str(work / "html"), env_dir=str(work / "env"))
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / "asv.conf.json", conf, indent=2)
    return 0


def environment_name(python: str) -> tuple[str, dict[str, str]]:
    """("existing-vllm" or "existing-python", {"python": version[, "vllm": version]})."""
    probe = ("import importlib.util, platform; print(platform.python_version()); "
             "print(__import__('vllm').__version__ if importlib.util.find_spec('vllm') else '')")
    python_version, vllm_version = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True,
                                                  timeout=300).stdout.splitlines()[:2]
    versions = {"python": python_version, **({"vllm": vllm_version} if vllm_version else {})}
    return ("existing-vllm" if vllm_version else "existing-python"), versions


def adopt(work_results: Path, results: Path, machine: str, sha: str, python: str) -> int:
    found = sorted((work_results / machine).glob(f"{sha[:8]}-existing-*.json"))
    if len(found) != 1:
        print(f"asv_existing.py: asv wrote {len(found)} result files for {sha[:8]} in {work_results / machine}",
              file=sys.stderr)
        return 1
    data = json.loads(found[0].read_text())
    if not any(_has_value(row) for row in data["results"].values()):
        print(f"asv_existing.py: {sha[:8]}: no value recorded (see asv's output above)", file=sys.stderr)
        return 1
    env_name, versions = environment_name(python)
    data.update(env_name=env_name, python=versions["python"], requirements={k: v for k, v in versions.items()
                                                                             if k != "python"})
    data["params"] = {**data["params"], **versions}
    (results / machine).mkdir(parents=True, exist_ok=True)
    target = results / machine / f"{sha[:8]}-{env_name}.json"
    write_json(target, data, sort_keys=True)
    suite_path = results / "benchmarks.json"
    suite = json.loads(suite_path.read_text()) if suite_path.is_file() else {"version": 2}
    ours = json.loads((work_results / "benchmarks.json").read_text())
    suite.update({name: entry for name, entry in ours.items() if name in data["results"]})
    write_json(suite_path, suite, indent=4, sort_keys=True)
    machine_json = work_results / machine / "machine.json"
    if machine_json.is_file() and not (results / machine / "machine.json").is_file():
        shutil.copyfile(machine_json, results / machine / "machine.json")
    print(f"asv_existing.py: {target}")
    return 0


def _has_value(row) -> bool:
    values = row[0] if isinstance(row, list) and row else row
    values = values if isinstance(values, list) else [values]
    return any(isinstance(v, (int, float)) for v in values)


def commit(results: Path) -> int:
    """Copy each machine folder of ``results`` into results/asv/ and commit results/asv only."""
    folders = sorted(p for p in results.iterdir() if p.is_dir()) if results.is_dir() else []
    if not folders:
        print(f"asv_existing.py: {results}: no machine folder of results to commit", file=sys.stderr)
        return 2
    committed = ROOT / "results" / "asv"
    for folder in folders:  # every check before any copy: all or nothing
        ours, theirs = committed / folder.name / "machine.json", folder / "machine.json"
        if ours.is_file() and not (theirs.is_file() and same_hardware(json.loads(ours.read_text()),
                                                                    json.loads(theirs.read_text()))):
            described = shown(json.loads(theirs.read_text())) if theirs.is_file() else "no hardware"
            print(f"asv_existing.py: {ours.relative_to(ROOT)} describes {shown(json.loads(ours.read_text()))}; "
                  f"{theirs} describes {described}: one machine name is one machine", file=sys.stderr)
            return 2
    names = []
    for folder in folders:
        (committed / folder.name).mkdir(parents=True, exist_ok=True)
        for path in folder.glob("*.json"):
            shutil.copyfile(path, committed / folder.name / path.name)
        names.append(folder.name)
    suite_path, theirs = committed / "benchmarks.json", json.loads((results / "benchmarks.json").read_text())
    suite = json.loads(suite_path.read_text()) if suite_path.is_file() else {"version": 2}
    suite.update({name: entry for name, entry in theirs.items() if name != "version"})
    write_json(suite_path, suite, indent=4, sort_keys=True)
    subprocess.run([str(ROOT / "benchmarks" / "first-parent-line")], check=True, timeout=300)
    paths = [str(committed / name) for name in names] + [str(suite_path), str(committed / "first-parent.tsv")]
    subprocess.run(["git", "-C", str(ROOT), "add", "--", *paths], check=True, timeout=60)
    subprocess.run(["git", "-C", str(ROOT), "commit", "-q", "-m", f"asv results of {', '.join(names)} "
                    "(scripts/gpu-runner; scripts/asv_existing.py commit)", "--", *paths], check=True, timeout=60)
    print(f"asv_existing.py: committed results/asv/{', results/asv/'.join(names)}")
    return 0


USAGE = __doc__.split("\n\n")[1].strip()


def main(argv: list[str]) -> int:
    commands = {"config": (1, config), "adopt": (5, adopt), "commit": (1, commit)}
    if not argv or argv[0] not in commands or len(argv) - 1 != commands[argv[0]][0]:
        print("usage: " + " | ".join(line.split("asv_existing.py ")[1] for line in USAGE.splitlines()),
              file=sys.stderr)
        return 2
    count, command = commands[argv[0]]
    args = [Path(argv[1]).resolve(), *argv[2:]]
    if command is adopt:
        args = [args[0], Path(argv[2]).resolve(), argv[3], argv[4], argv[5]]
    return command(*args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
