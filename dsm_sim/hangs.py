"""Handler calls that hung, counted in this process whichever bound caught them.

Two bounds stop a handler call that does not return: the kit's per-call
timeout for a handler in this process (``--call-timeout``, an event-loop
timer in :mod:`dsm_sim.conformance.execute.loop`) and the protocol client's
per-request timeout for a handler in another process (``--exec-timeout``,
which kills the process, :mod:`dsm_sim.protocol.client`).  Both note each hang
here, so a verification stops at the first one whichever it was: every later
call would wait the bound out again.

Each hang is counted with a sentence saying which call it was; the latest
:data:`KEPT` sentences are kept, so the stage that stops can name the first
hang it saw.
"""

from __future__ import annotations

import collections

__all__ = ["KEPT", "hang_since", "hangs_seen", "note_hang"]

#: How many of the latest hangs keep their sentence.
KEPT = 64

_count = 0
_said: collections.deque[tuple[int, str]] = collections.deque(maxlen=KEPT)


def note_hang(what: str) -> None:
    """Count a call that hung; ``what`` says which call, and which bound stopped it."""
    global _count
    _count += 1
    _said.append((_count, what))


def hangs_seen() -> int:
    """Calls that hung in this process so far (compare a count taken before with one after)."""
    return _count


def hang_since(count: int) -> str | None:
    """The sentence of the first hang after ``count`` (a :func:`hangs_seen`), if still kept."""
    for number, what in _said:
        if number > count:
            return what
    return None
