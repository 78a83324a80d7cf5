"""The garbage collector during a run: the heap that was there before it is not traversed again.

A simulated run and a verification build many small objects that live as
long as the run (every recorded operation, every view read around a call,
Hypothesis' choice sequences), so the collector promotes them and, every
few tens of thousands of allocations, traverses every object the process
holds: the modules, their classes and functions, the caches of Hypothesis
and SimPy, and whatever the caller keeps.  A profile of the in-memory
simulator and of ``dsm verify --profile dev`` put the collector at 10 to
25 % of their CPU time, most of it in full collections of that older heap,
which no run can free.

:func:`frozen_heap` moves the objects that exist when a run starts into
the permanent generation (:func:`gc.freeze`) and back when the outermost run
ends (:func:`gc.unfreeze`): the collector still collects everything the run
makes, and after the run everything is collectable as before.  A process
that keeps a frozen heap of its own (a pre-forking server freezes its heap
before forking) is left as it is.  Nothing a run decides depends on when
the collector runs, so results and reports are the same with or without
it.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap"]

_lock = threading.Lock()
#: Runs inside :func:`frozen_heap` now (across threads), and whether the outermost froze.
_depth = 0
_froze = False


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Run the body with the heap that exists now frozen; nested and concurrent uses share one freeze."""
    global _depth, _froze
    with _lock:
        if _depth == 0:
            # Someone else's frozen heap is theirs to unfreeze: leave the collector alone.
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _froze:
                gc.unfreeze()
                _froze = False
