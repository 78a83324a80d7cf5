"""A broken handler in its own process (``--exec``): every instant goes through local time.

The commonest time bug of a .NET handler: the request's ``now`` is parsed
into a ``DateTime`` of kind ``Unspecified``, and ``ToUniversalTime()`` then
reads it as the machine's local time.  In UTC nothing moves, so the handler
passes wherever the process runs in UTC, and in New York every lock,
stamp and retention is five hours off.  This script makes the same mistake
in Python (a naive ``datetime`` converted with ``astimezone``) and serves
it over the handler protocol (``docs/protocol.md``) on stdin and stdout,
as a handler in another language would be:

```console
$ dsm verify --exec "python -m dsm_sim.broken.exec_local_time"
```

The kit starts each test case's process with the zone it drew in ``TZ``
(and names it in ``open``), so the bug is caught without setting ``TZ`` by
hand (``tests/integration/test_exec_zones.py``).  It is not in the
catalogue (:data:`dsm_sim.broken.CATALOGUE`), whose handlers run in process.
"""

from __future__ import annotations

import datetime as dt
import sys

from reference_engine.clock import Clock
from reference_engine.handlers.memory import InMemoryStateHandler

__all__ = ["LocalTimeClock", "local_time_handler", "main"]

#: What ``dsm verify --exec`` runs.
COMMAND = f"{sys.executable} -m dsm_sim.broken.exec_local_time"


class LocalTimeClock:
    """The request's instant with its zone dropped, then converted to UTC as local time."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def now(self) -> dt.datetime:
        unspecified = self.clock.now().replace(tzinfo=None)  # DateTimeKind.Unspecified
        return unspecified.astimezone(dt.UTC)  # ToUniversalTime(): read as the local zone's


def local_time_handler(clock: Clock) -> InMemoryStateHandler:
    """The in-memory reference handler, reading "now" through local time."""
    return InMemoryStateHandler(LocalTimeClock(clock))


def main() -> int:
    """Serve :func:`local_time_handler` on stdin and stdout (``dsm serve``)."""
    from dsm_sim.cli import main as dsm

    return dsm(["serve", "dsm_sim.broken.exec_local_time:local_time_handler"])


if __name__ == "__main__":
    sys.exit(main())
