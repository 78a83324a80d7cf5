"""The ``dsm`` console script.

Each sub-command lives in its own module exposing ``configure(parser)`` and
``main(args) -> int``; this module only dispatches, so ``dsm demo`` does not
pay for importing the simulator.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "main"]

#: name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "reference_engine.demo",
        "narrated walk-through of the lifecycle on a fresh SQLite file",
    ),
    "verify": ("dsm_sim.conformance.cli", "run the conformance kit against a handler factory"),
    "run": ("dsm_sim.simulator.cli", "run chaos scenarios in the SimPy simulator"),
    "stress": ("dsm_sim.stress.cli", "multi-process stress run against a real database"),
    "diagram": (
        "reference_engine.diagram",
        "print the state diagram generated from the transition table",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsm",
        description="DataStateMachine: reference engine, conformance kit and chaos simulator.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # the command's module is not part of this installation
            raise
        command = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args._module.main(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
