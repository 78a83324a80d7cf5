"""The server ``--jobs`` workers fork from, started as the command starts.

``dsm verify --jobs`` and ``dsm run --jobs`` start their worker processes
with ``forkserver``: each worker is a fork of one server process that has
already imported the kit, so a worker is ready as soon as it has loaded the
handler.  Importing the kit takes that server most of a second, and the
command's own process spends about as long importing the same modules before
it asks for its first worker.  Started by the console script before the
command's module is imported (:func:`start_early`), the server imports the
kit on the other core meanwhile, and the first chunk of work reaches a worker
that much sooner; on two cores, with a verification of a few seconds, that is
a tenth of the wall time.

Nothing else changes: the pools ask for the same server, and a server started
for a command that then runs in one process only idles until the command ends.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from multiprocessing import forkserver

from dsm_sim.options import usable_cores

__all__ = ["PRELOADS", "jobs_asked", "start_early"]

#: The module each command's pool has its server preload (the pools name the same one).
PRELOADS: dict[str, str] = {
    "verify": "dsm_sim.conformance.parallel",
    "run": "dsm_sim.simulator.parallel",
}
#: Options under which the command does not fork its own workers.
_NO_LOCAL_WORKERS = ("--exec", "--cluster")


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
        if word == "--jobs" and index + 1 < len(words):
            jobs = words[index + 1]
        elif word.startswith("--jobs="):
            jobs = word.partition("=")[2]
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
    if any(word.split("=")[0] in _NO_LOCAL_WORKERS for word in words[1:]):
        return False
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    multiprocessing.get_context("forkserver").set_forkserver_preload([PRELOADS[words[0]]])
    forkserver.ensure_running()
    return True
