"""``kvoffload COMMAND --help`` explains every option: a user reading the help of ``run`` learns
what ``--scheduling`` or ``--set`` does without opening the source."""

from __future__ import annotations

import argparse

from kvoffload.cli.app import build_parser


def options_without_help(parser: argparse.ArgumentParser, path: str = "kvoffload") -> list[str]:
    """``path OPTION`` for each action of ``parser`` and of every subcommand under it that has no
    help text (argparse's own -h/--help aside)."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {name}")
        if isinstance(action, argparse._SubParsersAction):
            described = {choice.dest: choice.help for choice in action._choices_actions}
            for command, subparser in action.choices.items():
                if not described.get(command):
                    missing.append(f"{path} {command} (the command itself)")
                missing += options_without_help(subparser, f"{path} {command}")
    return missing


def test_every_option_of_every_command_has_help():
    assert options_without_help(build_parser()) == []


def test_the_walk_finds_an_option_without_help():
    """The check above can fail: an option added without help is named with its command."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands.choices["run"].add_argument("--colour")
    commands.choices["bench"].add_argument("depth", nargs="?")
    assert options_without_help(parser) == ["kvoffload run --colour", "kvoffload bench depth"]
