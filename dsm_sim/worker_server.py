"""The server ``dsm verify --jobs`` workers fork from, started as the command starts.

``dsm verify --jobs`` starts its worker processes with ``forkserver``: each
worker is a fork of one server process that has already imported the kit,
so a worker is ready as soon as it has loaded the handler.  Importing the
kit takes that server most of a second, and the command's own process spends
about as long importing the same modules before it asks for its first
worker.  Started by the console script before the command's module is
imported (:func:`start_early`), the server imports the kit on the other core
meanwhile, and the first chunk of work reaches a worker that much sooner; on
two cores, with a verification of a few seconds, that is a tenth of the wall
time.

A forked worker starts from the server's environment, as it was when the
server started, not from the command's environment when the worker is
forked.  ``dsm verify`` hands its workers everything in their tasks, so that
is the same; ``dsm run`` sets ``DSM_CALL_TIMEOUT`` for its workers after
parsing its options, so its server is not started early.  A command added
here must hand its workers nothing through the environment.  A server
started for a command that then runs in one process idles until the
command ends.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from multiprocessing import forkserver

from dsm_sim.options import usable_cores

__all__ = ["ELSEWHERE", "JOBS", "PRELOADS", "jobs_asked", "start_early"]

#: The module each command's pool has its server preload (the pools name the same one).
PRELOADS: dict[str, str] = {"verify": "dsm_sim.conformance.parallel"}
#: ``dsm verify``'s options this module reads, each with the shortest abbreviation argparse
#: takes for it (``tests/unit/test_worker_server.py`` checks them against the parser).
JOBS = ("--jobs", "--jo")
#: Options under which the command forks no workers of its own.
ELSEWHERE = (("--exec", "--exec"), ("--exec-tcp", "--exec-tc"), ("--cluster", "--clu"))


def _names(word: str, option: tuple[str, str]) -> bool:
    """Whether ``word`` (up to any ``=``) is the option or an abbreviation argparse would take."""
    name = word.partition("=")[0]
    full, shortest = option
    return name.startswith(shortest) and full.startswith(name)


def jobs_asked(words: Sequence[str]) -> int:
    """The ``--jobs`` a command line asks for (1 when it asks for none or is unreadable).

    Read without the command's parser, which lives in the module this saves
    time by not waiting for: a value the parser would refuse starts nothing,
    and the parser then says what is wrong.
    """
    jobs = "1"
    for index, word in enumerate(words):
        if word == "--":
            break
        if not _names(word, JOBS):
            continue
        _, equals, value = word.partition("=")
        if equals:
            jobs = value
        elif index + 1 < len(words):
            jobs = words[index + 1]
    if jobs.strip().lower() == "auto":
        return usable_cores()
    try:
        return int(jobs)
    except ValueError:
        return 1


def start_early(words: Sequence[str]) -> bool:
    """Start the worker server for the command line ``words`` (command first), if it will fork one.

    True when a server was started.  Only where ``forkserver`` exists, for a
    command in :data:`PRELOADS` with ``--jobs`` above 1 and no option that
    sends the work elsewhere.
    """
    if not words or words[0] not in PRELOADS or jobs_asked(words[1:]) <= 1:
        return False
    if any(_names(word, option) for word in words[1:] for option in ELSEWHERE):
        return False
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    multiprocessing.get_context("forkserver").set_forkserver_preload([PRELOADS[words[0]]])
    forkserver.ensure_running()
    return True
