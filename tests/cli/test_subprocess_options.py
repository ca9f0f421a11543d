"""Issue 22: a computed string reached git as an option (``gate --baseline=--output=X``). Every
subprocess call of the package is read (its syntax tree, not run) for an argv whose computed
elements could be read as options."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
# git -C PATH, python -c CODE: the next element is the option's value, whatever it starts with
OPTIONS_WITH_A_VALUE = {"-C", "-c"}
# Modules run as ``python -m MODULE ARGS`` that read ARGS as positional values, no option parsing:
# after them an element is a value whatever it starts with (like after "--").
POSITIONAL_MODULES = {"kvoffload.vllm.rows"}  # main(argv): one "workload:scheduling" job per element


def _list_assigned(tree: ast.AST, call: ast.Call, name: str) -> ast.List | None:
    """The list literal last assigned to ``name`` before ``call`` (an argv built in a variable)."""
    found = None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and node.lineno < call.lineno and isinstance(node.value, ast.List)
                and any(isinstance(target, ast.Name) and target.id == name for target in node.targets)):
            if found is None or node.lineno > found.lineno:
                found = node
    return found.value if found is not None else None


def _string_constants(tree: ast.AST) -> set[str]:
    """Names the module assigns a string literal (``_CHILD = "import ..."``): literals by another name."""
    return {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def option_injections(tree: ast.AST, where: str) -> list[str]:
    """Places in ``tree`` where a computed string could reach a subprocess as an option: in an
    argv given as a list (or a variable assigned one), an element that is not a string literal,
    not the program (element 0), not after ``--`` or ``-m`` and a module of POSITIONAL_MODULES,
    and not the value of an option in OPTIONS_WITH_A_VALUE; an argv that is not a list at all; a
    shell (``os.system``, ``shell=True``)."""
    found = []
    constants = _string_constants(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        name = f"{owner}.{node.func.attr}"
        if owner == "os" and (node.func.attr == "system" or node.func.attr.startswith(("exec", "spawn", "popen"))):
            found.append(f"{where}:{node.lineno}: {name}")
            continue
        if owner != "subprocess" or node.func.attr not in SUBPROCESS_CALLS:
            continue
        if any(keyword.arg == "shell" for keyword in node.keywords):
            found.append(f"{where}:{node.lineno}: {name}(shell=...)")
        argv = node.args[0] if node.args else None
        if isinstance(argv, ast.Name):
            argv = _list_assigned(tree, node, argv.id)
        if not isinstance(argv, (ast.List, ast.Tuple)):
            found.append(f"{where}:{node.lineno}: {name} with a computed argv")
            continue
        options_over = False
        for position, element in enumerate(argv.elts):
            literal = isinstance(element, ast.Constant) and isinstance(element.value, str) or (
                isinstance(element, ast.Name) and element.id in constants)
            after_value_option = position and isinstance(argv.elts[position - 1], ast.Constant) \
                and argv.elts[position - 1].value in OPTIONS_WITH_A_VALUE
            if not (literal or position == 0 or options_over or after_value_option):
                found.append(f"{where}:{node.lineno}: {name}, element {position} ({ast.unparse(element)})")
            value = element.value if isinstance(element, ast.Constant) else None
            options_over = options_over or (literal and value == "--") or (
                literal and value in POSITIONAL_MODULES and position
                and isinstance(argv.elts[position - 1], ast.Constant) and argv.elts[position - 1].value == "-m")
    return found


def test_no_computed_string_reaches_a_subprocess_as_an_option():
    """Issue 22: ``gate --baseline=--output=X`` reached git as an option. Every subprocess call of
    the package passes an argv list whose computed elements cannot be read as options (the gate's
    git calls, in gate_baseline.py, aside: the gate's own tests check them)."""
    sources = [path for path in sorted((REPO / "reference" / "kvoffload").rglob("*.py"))
               if path.name not in ("gate.py", "gate_baseline.py")]  # the gate's git calls live in gate_baseline.py
    found = [place for path in sources
             for place in option_injections(ast.parse(path.read_text()), str(path.relative_to(REPO)))]
    assert found == []
    # the check itself: a user's ref given to git show, a shell, a computed argv are all found
    planted = ast.parse("subprocess.run(['git', '-C', root, 'show', ref])\nsubprocess.run(['git', 'show', '--', ref])\n"
                        "subprocess.run(argv)\nos.system(line)\nsubprocess.run(['ls'], shell=True)\n"
                        "command = [python, '-m', 'kvoffload.vllm.rows', *jobs]\nsubprocess.run(command)\n"
                        "command = [python, '-m', 'pytest', *user_args]\nsubprocess.run(command)\n"
                        "CODE = 'print(1)'\nsubprocess.Popen([python, '-c', CODE])\nsubprocess.Popen([python, code])\n")
    assert [place.split(": ", 1)[1] for place in option_injections(planted, "x")] == [
        "subprocess.run, element 4 (ref)", "subprocess.run with a computed argv", "os.system",
        "subprocess.run(shell=...)", "subprocess.run, element 3 (*user_args)", "subprocess.Popen, element 1 (code)"]
