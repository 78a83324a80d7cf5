"""``dsm COMMAND --help`` says what every option does and what it is when not given.

A reviewer reading ``--help`` decides from it how a run was configured: an
option without help, or with a default it does not say, leaves them to
read the code.  An option two commands share is described alike.
"""

from __future__ import annotations

import argparse

import pytest

from dsm_sim.cli import build_parser

pytestmark = pytest.mark.unit

#: (command, option) whose help gives its default in other words.
DEFAULT_IN_OTHER_WORDS = {
    ("verify", "--clock"): "describes 'system' only; the default is 'injected'",
}


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _says_nothing_by_default(action: argparse.Action) -> bool:
    return action.default in (None, False, [], ()) or isinstance(
        action, argparse._StoreTrueAction | argparse._HelpAction
    )


def test_every_option_has_help_and_says_its_default() -> None:
    missing = []
    for name, command in commands().items():
        for action in command._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            option = max(action.option_strings, key=len)
            if not action.help:
                missing.append(f"dsm {name} {option}: no help")
            elif (
                not _says_nothing_by_default(action)
                and "default" not in action.help
                and (name, option) not in DEFAULT_IN_OTHER_WORDS
            ):
                missing.append(f"dsm {name} {option}: help does not say its default")
    assert not missing, "\n".join(missing)


def test_call_timeout_is_described_alike_in_verify_and_run() -> None:
    found = {
        name: next(
            a.help for a in commands()[name]._actions if "--call-timeout" in a.option_strings
        )
        for name in ("verify", "run")
    }
    shared = "how long one in-process handler call (open and close included) may take"
    assert all(str(text).startswith(shared) for text in found.values()), found
