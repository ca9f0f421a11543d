"""Fault trials (issue 31): a command ended by SIGINT or SIGKILL at a drawn moment, and what it
left behind counted.

Each trial runs one command of ``COMMANDS`` in a scratch copy of this checkout's tracked files
(its own git repository, so ``publish`` finds a clean tree and nothing of the checkout can
change), in a session of its own, marked by an environment variable every process it starts
inherits. At a moment drawn from the trial's seeded generator, a fraction of a whole run of the
same command timed in the same copy (so the signal lands inside the run on an idle machine and on
a loaded one alike), it sends:

- SIGINT to the session's process group, as a terminal's Ctrl-C does: the command must exit 130
  (or have finished first);
- SIGKILL to the command's own process (nothing of it runs to clean up); the command is then run
  again to the end, and what the killed run left must be gone after it.

Counted per trial (all must be 0): *orphans*, processes carrying the trial's mark still running
``ORPHAN_GRACE_S`` after the command ended; *partial files*, outputs under their final name that
are not whole (JSON that does not parse, a PNG without its end chunk, an HTML page without its
end), and temporary files left (after a SIGINT; after the next run for a SIGKILL); *changed
tracked files*, ``git status`` of the copy (``publish`` rewrites tracked charts: the copy first
commits a complete run's output, so a whole rewrite is no change).

``python tests/fuzz_cli/fault_trials.py [--runs N] [--seed S] [COMMAND ...]`` prints the table;
``test_fault_trials.py`` runs them under pytest (the nightly profile: every command, both
signals, ``KVOFFLOAD_FAULT_RUNS`` seeds each).
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
MARK = "KVOFFLOAD_FAULT_TRIAL"
ORPHAN_GRACE_S = 10.0  # a killed command's children have this long to notice and end
RUN_BOUND_S = 600  # no trial's command may run longer (a hang is a finding, not a wait)
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
SIGNALS = {"SIGINT": signal.SIGINT, "SIGKILL": signal.SIGKILL}

# A release venv's stand-in: the preset's own rows from the simulator (what a release that agrees
# with its preset prints), after starting a replay of its own that never ends (a grandchild of
# ``releases``: it must die with the release's tree).
RELEASE_STAND_IN = """
import json, os, subprocess, sys
from kvoffload.release_io import die_with_parent, split_job
die_with_parent()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
from kvoffload.releases import simulator_row
for job in sys.argv[3:]:
    name, scheduling = split_job(job)
    sim = simulator_row(name, scheduling, "vllm-0.29")
    print(json.dumps({"release": "0.29.0", "workload": name, "scheduling": scheduling, "metrics": sim.metrics,
                      "error": sim.error, "leaked": [], "stuck": [], "first_admission": sim.first_admission}))
"""


@dataclass(frozen=True)
class Command:
    """A command as a trial runs it: its argv (in the copy), the folders its outputs go to
    (relative to the copy), and how long a whole run takes (the span a moment is drawn from; None:
    timed by a whole run in the copy, ``whole_run_seconds``)."""

    name: str
    argv: tuple[str, ...]
    outputs: tuple[str, ...]
    seconds: float | None = None
    # The moment is drawn from [settle, settle + span]: a signal in the interpreter's own first
    # fraction of a second, before any code of ours runs, is Python's to handle (a traceback).
    settle: float = 1.0


KV = (sys.executable, "-m", "kvoffload.cli")
COMMANDS = {
    "run": Command("run", (*KV, "run", "--workload", "multi-turn-small", "--out", "out/run/r.json", "--trace",
                           "out/run/t.json"), ("out/run",)),
    "bench": Command("bench", (*KV, "bench", "--small", "--quiet", "--out-dir", "out/bench"), ("out/bench",)),
    "sweep": Command("sweep", (*KV, "sweep", "--workload", "multi-turn-small", "--preset", "reference", "--preset",
                               "vllm-0.25", "--grid", "cpu_chunks=16,64", "--jobs", "2", "--quiet", "--out-dir",
                               "out/sweep"), ("out/sweep",)),
    "report": Command("report", (*KV, "report", "--from", "results", "--out", "out/charts"), ("out/charts",)),
    "releases": Command("releases", (*KV, "releases", "--release", "0.29.0", "--workload", "multi-turn-small",
                                     "--out", "out/releases/releases.json"), ("out/releases",)),
    "publish": Command("publish", ("benchmarks/publish", "--charts"), ("results/charts", "results/scaling")),
}


TRIALS: list["Trial"] = []  # every trial of this session, in order (conftest prints their table)


@dataclass
class Trial:
    command: str
    signal: str
    seed: int
    moment: float = 0.0
    span: float = 0.0  # the whole run the moment was drawn from
    exit: int | None = None
    finished_first: bool = False
    orphans: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def clean(self) -> bool:
        expected_exit = self.exit == 0 if self.finished_first else (
            self.exit == 130 if self.signal == "SIGINT" else self.exit == -signal.SIGKILL)
        return expected_exit and not (self.orphans or self.partial or self.changed)


# ---- the copy ---------------------------------------------------------------------------------


def make_copy(folder: Path, publish: bool = True) -> Path:
    """This checkout's tracked files (as committed) as a repository of their own under ``folder``,
    with the checkout's venv, a release stand-in venv, and (``publish``) the output of a whole
    ``publish --charts`` committed."""
    copy = folder / "copy"
    copy.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    (copy / ".venv").symlink_to(REPO / ".venv")
    venv = copy / ".venv-vllm-0.29.0" / "bin"
    venv.mkdir(parents=True)
    (copy / "release_stand_in.py").write_text(RELEASE_STAND_IN)
    (venv / "python").write_text(f"#!/bin/sh\nexec {sys.executable} {copy / 'release_stand_in.py'} \"$@\"\n")
    os.chmod(venv / "python", 0o755)
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "-m", "fault trials: this checkout's tracked files")
    if not publish:
        return copy
    done = subprocess.run(list(COMMANDS["publish"].argv), cwd=copy, capture_output=True, text=True, timeout=RUN_BOUND_S)
    if done.returncode != 0:
        raise RuntimeError(f"publish --charts in the copy: {done.stderr.strip()[-300:]}")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "--allow-empty", "-m", "fault trials: publish --charts, whole")
    return copy


def _git(copy: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "trials", "GIT_AUTHOR_EMAIL": "trials@localhost",
           "GIT_COMMITTER_NAME": "trials", "GIT_COMMITTER_EMAIL": "trials@localhost"}
    return subprocess.run(["git", "-C", str(copy), *args], capture_output=True, text=True, check=True, env=env).stdout


# ---- one trial --------------------------------------------------------------------------------


# A moment is drawn from the first 90 % of the span after the settle: a signal in a run's last
# instants mostly finds it finished, which tests nothing.
SPAN_SHARE = 0.9


@functools.lru_cache(maxsize=None)
def whole_run_seconds(copy: Path, command: Command) -> float:
    """``command.seconds``, or the wall time of one whole run of it in ``copy`` (its outputs then
    removed): estimates fixed in the code let an idle machine finish every run before the moment
    (18 of 18 run, bench and sweep trials finished first at load 6)."""
    if command.seconds is not None:
        return command.seconds
    started, mark = time.monotonic(), f"{command.name}-whole-{os.getpid()}"
    process, err = _start(copy, command, mark)
    try:
        process.wait(timeout=RUN_BOUND_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    seconds = time.monotonic() - started
    err, left = _read(err), _orphans(mark)
    _reset(copy, command)
    if process.returncode != 0 or left:
        raise RuntimeError(f"{command.name}: a whole run in the copy exited {process.returncode}, left {left}: "
                           f"{err.strip()[-300:]}")
    return seconds


def run_trial(copy: Path, command: Command, signal_name: str, seed: int) -> Trial:
    span = max(whole_run_seconds(copy, command) - command.settle, 0.1) * SPAN_SHARE
    moment = command.settle + random.Random(seed).uniform(0, span)
    trial = Trial(command.name, signal_name, seed, moment=round(moment, 2), span=round(span + command.settle, 2))
    mark = f"{command.name}-{signal_name}-{seed}-{os.getpid()}"
    process, err = _start(copy, command, mark)
    try:
        process.wait(timeout=trial.moment)
        trial.finished_first = True
    except subprocess.TimeoutExpired:
        if signal_name == "SIGINT":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGKILL)
    try:
        process.wait(timeout=RUN_BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        trial.note = "still running after the signal"
    err = _read(err)
    trial.exit = process.returncode
    if trial.exit not in (0, 130, -signal.SIGKILL) and not trial.note:
        trial.note = err.strip().splitlines()[-1][:200] if err.strip() else f"exit {trial.exit}"
    trial.orphans = _orphans(mark)
    temporaries = _temporaries(copy, command)
    if signal_name == "SIGKILL" and not trial.finished_first:  # the next run must clean up after it
        again, err = _start(copy, command, mark + "-again")
        again.wait(timeout=RUN_BOUND_S)
        err = _read(err)
        if again.returncode != 0:
            trial.note = f"the next run exited {again.returncode}: {err.strip()[-200:]}"
        temporaries = _temporaries(copy, command)
        trial.orphans += _orphans(mark + "-again")
    trial.partial = _partial_files(copy, command) + temporaries
    trial.changed = [line for line in _git(copy, "status", "--porcelain", "--untracked-files=no").splitlines()]
    _reset(copy, command)
    return trial


def _start(copy: Path, command: Command, mark: str):
    """The command started, and the file its stderr goes to (a file: an orphan holding a pipe
    would make reading it wait for the orphan)."""
    err = tempfile.TemporaryFile()
    process = subprocess.Popen(list(command.argv), cwd=copy, env={**os.environ, MARK: mark}, stdout=subprocess.DEVNULL,
                               stderr=err, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a user's Ctrl-C
    return process, err


def _read(err) -> str:
    with err:
        err.seek(0)
        return err.read().decode("utf-8", errors="replace")


def _orphans(mark: str) -> list[str]:
    """Processes carrying ``mark`` (and not zombies) still running after the grace period."""
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
            except (OSError, IndexError):
                continue
            if f"{MARK}={mark}".encode() + b"\0" in environ + b"\0" and state != "Z":
                found.append(f"{entry} {cmdline}")
        if not found or time.monotonic() > deadline:
            for line in found:  # counted; then ended, so one trial's leftovers never reach the next
                try:
                    os.kill(int(line.split()[0]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return found
        time.sleep(0.2)


def _temporaries(copy: Path, command: Command) -> list[str]:
    return [f"left: {path.relative_to(copy)}" for folder in command.outputs if (copy / folder).exists()
            for path in sorted((copy / folder).rglob("*")) if path.is_file() and path.name.endswith(".tmp")]


def _partial_files(copy: Path, command: Command) -> list[str]:
    """Outputs under their final names that are not whole."""
    bad = []
    for folder in command.outputs:
        for path in sorted((copy / folder).rglob("*")) if (copy / folder).exists() else []:
            if not path.is_file() or path.name.endswith(".tmp"):
                continue
            data = path.read_bytes()
            whole = True
            if path.suffix == ".json":
                try:
                    json.loads(data)
                except ValueError:
                    whole = False
            elif path.suffix == ".png":
                whole = data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(PNG_END)
            elif path.suffix == ".html":
                whole = data.rstrip().endswith(b"</html>")
            elif path.suffix in (".md", ".csv"):
                whole = bool(data)
            if not whole:
                bad.append(f"partial: {path.relative_to(copy)}")
    return bad


def _reset(copy: Path, command: Command) -> None:
    """The copy as committed again, and the command's scratch outputs gone: one trial's debris
    is never the next one's finding."""
    _git(copy, "checkout", "-q", "--", ".")
    for folder in command.outputs:
        if folder.startswith("out/"):
            subprocess.run(["rm", "-rf", str(copy / folder)], check=True)


# ---- many trials, and their table -------------------------------------------------------------


def run_trials(commands: list[str], runs: int, base_seed: int, folder: Path | None = None,
               on_trial: Callable[[Trial], None] | None = None) -> list[Trial]:
    with tempfile.TemporaryDirectory(prefix="kvoffload-fault-trials-", dir=folder) as scratch:
        copy = make_copy(Path(scratch), publish="publish" in commands)
        trials = []
        for name in commands:
            for signal_name in SIGNALS:
                for run in range(runs):
                    trial = run_trial(copy, COMMANDS[name], signal_name, base_seed + run)
                    trials.append(trial)
                    if on_trial is not None:
                        on_trial(trial)
        return trials


def table(trials: list[Trial]) -> str:
    """runs x commands x signals: exits, and the three counts (orphans, partial files, changed
    tracked files), one row per command and signal."""
    lines = ["| command | signal | trials | ended by the signal (exit) | finished first | orphans | partial files "
             "| changed tracked files | clean |", "|---|---|---|---|---|---|---|---|---|"]
    keys = dict.fromkeys((t.command, t.signal) for t in trials)
    for command, signal_name in keys:
        mine = [t for t in trials if (t.command, t.signal) == (command, signal_name)]
        ended = [t for t in mine if not t.finished_first]
        exits = ", ".join(f"{code} x{sum(t.exit == code for t in ended)}" for code in sorted({t.exit for t in ended}))
        lines.append(f"| {command} | {signal_name} | {len(mine)} | {len(ended)} ({exits or '-'}) "
                     f"| {len(mine) - len(ended)} | {sum(len(t.orphans) for t in mine)} "
                     f"| {sum(len(t.partial) for t in mine)} | {sum(len(t.changed) for t in mine)} "
                     f"| {sum(t.clean for t in mine)}/{len(mine)} |")
    return "\n".join(lines)


def describe(trial: Trial) -> str:
    what = "finished first" if trial.finished_first else f"exit {trial.exit}"
    found = trial.orphans + trial.partial + trial.changed + ([trial.note] if trial.note else [])
    return (f"{trial.command} {trial.signal} seed {trial.seed} at {trial.moment} s of a {trial.span} s run: {what}"
            + (f"; {'; '.join(found)}" if found else ""))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commands", nargs="*", default=list(COMMANDS), choices=list(COMMANDS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=31)
    options = parser.parse_args()
    started = time.monotonic()
    done = run_trials(options.commands, options.runs, options.seed, on_trial=lambda t: print(describe(t), flush=True))
    print(f"\n{len(done)} trials in {time.monotonic() - started:.0f} s (load {os.getloadavg()[0]:.1f})\n")
    print(table(done))
