"""A run freezes the heap it starts with and gives it back; a heap frozen by someone else is theirs."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from dsm_sim.collector import frozen_heap

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()  # whatever ran before in this process
    yield
    gc.unfreeze()


def test_the_heap_before_the_run_is_frozen_during_it_and_not_after() -> None:
    kept = [object() for _ in range(10)]
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        assert gc.is_tracked(kept)
    assert gc.get_freeze_count() == 0


def test_what_the_run_makes_is_still_collected() -> None:
    class Cycle:
        other: object = None

    with frozen_heap():
        one, two = Cycle(), Cycle()
        one.other, two.other = two, one
        gone = len(gc.get_objects())
        del one, two
        gc.collect()
        assert len(gc.get_objects()) < gone


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every freeze and unfreeze (the freeze count alone drifts as frozen objects die)."""
    calls: list[str] = []
    freeze, unfreeze = gc.freeze, gc.unfreeze

    def spied_freeze() -> None:
        calls.append("freeze")
        freeze()

    def spied_unfreeze() -> None:
        calls.append("unfreeze")
        unfreeze()

    monkeypatch.setattr(gc, "freeze", spied_freeze)
    monkeypatch.setattr(gc, "unfreeze", spied_unfreeze)
    return calls


def test_nested_runs_unfreeze_once_the_outermost_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    with frozen_heap():
        with frozen_heap():
            assert gc.get_freeze_count() > 0
        assert calls == ["freeze"]
        assert gc.get_freeze_count() > 0
    assert calls == ["freeze", "unfreeze"]
    assert gc.get_freeze_count() == 0


def test_an_exception_still_unfreezes() -> None:
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_the_process_itself_is_left_frozen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc.freeze()
    calls = _spy(monkeypatch)
    with frozen_heap():
        pass
    assert calls == [], "a heap someone else froze is theirs to unfreeze"
    assert gc.get_freeze_count() > 0


def test_runs_in_two_threads_share_one_freeze() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with frozen_heap():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(10)
    with frozen_heap():
        pass
    assert gc.get_freeze_count() > 0  # the other thread's run is still going
    release.set()
    thread.join(10)
    assert gc.get_freeze_count() == 0
