"""The ``dsm`` console script.

Each sub-command lives in its own module exposing ``configure(parser)`` and
``main(args) -> int``; this module only dispatches, so ``dsm demo`` does not
pay for importing the simulator.  The current directory goes on the import
path first, as pytest does for its rootdir: ``--handler mymodule:factory``
then loads ``mymodule.py`` from where the command was run.

Every command ends here, so this is where nothing may escape as a bare
traceback that leaves the user guessing whose fault it was: a named error
(:class:`~reference_engine.errors.DsmError`, the root of the engine's and the
harness's errors) is one line and exit status 2; anything else is a bug in
dsm or in the code it ran, printed with its traceback, said to be one, and
exit status 3 (never 1, which the commands keep for a verdict); Ctrl-C is
exit status 130, quietly.

``SIGTERM`` (a CI job's timeout, ``docker stop``, ``kill``) is handled as
Ctrl-C is: it is passed to the interrupt handler in force, so every command
runs the clean-up it runs on Ctrl-C (worker processes stopped, handler
processes ended, a stress run's queue and schema removed), and the exit
status is 143 (128 + SIGTERM).  Left to its default, ``SIGTERM`` would end
this process at once and leave all of that behind.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from reference_engine.errors import DsmError

__all__ = ["COMMANDS", "EXIT_BUG", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "EXIT_USAGE", "main"]

#: A named error: the command, its options, a file it reads or the handler it was given is wrong.
EXIT_USAGE = 2
#: An exception no command turned into a named error: a bug, not a verdict or a usage error.
EXIT_BUG = 3
#: Interrupted with Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: Stopped with SIGTERM (128 + SIGTERM), after the same clean-up as Ctrl-C.
EXIT_TERMINATED = 128 + int(signal.SIGTERM)
#: Said under the traceback of an exception no command turned into a named error.
BUG_NOTE = (
    "this is a bug in dsm (or in the handler code it ran, if the traceback ends there): "
    "no command should end with an unnamed exception. Please report it to the dsm "
    "maintainers with the command line and the traceback above."
)

#: name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "dsm_sim.teaching.demo_command",
        "narrated walk-through of the lifecycle on a fresh SQLite file or your own handler",
    ),
    "verify": ("dsm_sim.conformance.cli", "run the conformance kit against a handler factory"),
    "run": ("dsm_sim.simulator.cli", "run chaos scenarios in the SimPy simulator"),
    "stress": ("dsm_sim.stress.cli", "multi-process stress run against a real database"),
    "diagram": (
        "dsm_sim.teaching.diagram",
        "print the state diagram generated from the transition table",
    ),
    "serve": (
        "dsm_sim.protocol.server",
        "serve a Python handler factory over the handler protocol on stdin/stdout",
    ),
    "replay": (
        "dsm_sim.protocol.replay",
        "send the requests of a replay file to a handler process and print its answers",
    ),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsm",
        description="DataStateMachine: reference engine, conformance kit and chaos simulator.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
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


#: Where the handler processes a command started are known (loaded only by commands that do).
_GROUPS = "dsm_sim.protocol.groups"


@contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """Route SIGTERM to the SIGINT handler in force while the block runs; yields what arrived.

    The handler in force is read when the signal comes: asyncio's own while
    ``asyncio.run`` runs (it cancels the main task, so its ``finally`` blocks
    run), else Python's, which raises ``KeyboardInterrupt``.  Only the main
    thread can install a handler; elsewhere the block runs as it is.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        # Every handler process ends now: one that stopped answering would hold the
        # clean-up for its whole request timeout, and none starts after this.  (Not
        # loaded: this command started none, and stays light for those that never do.)
        groups = sys.modules.get(_GROUPS)
        if groups is not None:
            groups.stop_all()
        interrupt = signal.getsignal(signal.SIGINT)
        if callable(interrupt):
            interrupt(signal.SIGINT, frame)
        else:  # SIGINT ignored or left to the system: still stop, as Ctrl-C would
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)
        groups = sys.modules.get(_GROUPS)
        if received and groups is not None:
            groups.resume()


def main(argv: Sequence[str] | None = None) -> int:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    words = list(sys.argv[1:] if argv is None else argv)
    command = f"dsm {words[0]}" if words and words[0] in COMMANDS else "dsm"
    if argv is None:  # this process is the command: its --jobs workers' server starts now
        from dsm_sim.worker_server import start_early

        with contextlib.suppress(OSError):  # the pool starts it, or says why it cannot
            start_early(words)
    with sigterm_as_interrupt() as received:
        code = _dispatch(words, command, received)
    if argv is None and command in _EXIT_WHEN_DONE:
        exit_when_done(code)
    return code


#: Commands that end the process once they have returned their code (their verdict is out).
_EXIT_WHEN_DONE = frozenset({"dsm verify", "dsm run"})


def exit_when_done(code: int) -> None:
    """End the process with ``code`` now if a thread other than main would keep it alive.

    A handler may start a non-daemon thread and never stop it, and an executor
    thread blocked in a hung call is never joined (the interpreter would join
    both at exit, for as long as they block).  The verdict and the output files
    are written by now: the streams are flushed, the handler processes ended
    (as at any exit), and the process exits with its code.
    """
    main = threading.main_thread()
    held = [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]
    if not held:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    groups = sys.modules.get(_GROUPS)
    if groups is not None:
        groups.end_all()
    os._exit(code)


def _dispatch(words: list[str], command: str, received: list[int]) -> int:
    try:
        # A named command imports its own module only (``dsm serve`` starts once per
        # test case of the kit, ``dsm run`` once per worker); ``dsm``, ``dsm --help``
        # and an unknown word get the parser of every command, to list them.
        parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
        args = parser.parse_args(words)
        code: int = args._module.main(args)
    except KeyboardInterrupt:
        return EXIT_TERMINATED if received else EXIT_INTERRUPTED
    except DsmError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:
        traceback.print_exc()
        print(f"\n{command}: {BUG_NOTE}", file=sys.stderr)
        return EXIT_BUG
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
