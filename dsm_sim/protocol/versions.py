"""The protocol versions this harness speaks, and what each changed.

A change that would fail a handler which was right under the earlier text
is a new version.  The harness speaks every version it has shipped and
judges each handler by the text of the version it answered ``open`` with:
a handler written to version 1 keeps passing after version 2, and a
handler that moves to version 2 says so.  Everything that differs between
versions is in this module, as data (:data:`VERSIONS`); the client, the
server and the replay judgement ask it and hold no rule of their own.

The handshake (``docs/protocol.md``, "Versions"): ``open`` carries
``"protocol": 1`` and ``"protocols": [1, 2]``.  A handler that knows the
list answers the version it speaks from it; one written to version 1 reads
no list and repeats ``protocol``, so it is judged by version 1, as it was
written.

A version keeps accepting the kinds later versions added: hosts that
announced version 1 answered ``instant_out_of_range`` from the day the kind
was added, and it names the model's error exactly.  What a version changes
is which *other* answer stands for the model's error: under version 1,
``internal`` does for an instant past year 9999 (:data:`INSTANT_OUT_OF_RANGE`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsm_sim.protocol import wire
from reference_engine.context import StateHandlerContext
from reference_engine.errors import DsmError, InstantOutOfRangeError
from reference_engine.model import ReferenceModel
from reference_engine.status import IdempotencyStatus

__all__ = [
    "FIRST",
    "NEWEST",
    "OFFER",
    "VERSIONS",
    "Change",
    "Version",
    "agrees",
    "describe",
    "earlier_reading",
    "judged_by",
    "note",
    "offered",
    "past_the_last_instant",
    "spoken",
    "with_offer",
]


#: The operations whose instants can pass the last one a record can hold.
_WRITES = frozenset({"try_acquire_lock", "set", "release_lock_as_failed", "upsert"})


def past_the_last_instant(
    op: str,
    ctx: StateHandlerContext | None,
    now: dt.datetime | None,
    request: Mapping[str, Any],
) -> InstantOutOfRangeError | None:
    """The model's answer to a request when it is ``InstantOutOfRangeError``, else None.

    Every error the model raises before this one (an unsupported status, a
    payload over the limit, a release without a token) is read from the
    request alone, so the call is made on an empty model: what it raises
    there, it raises on every store.
    """
    if ctx is None or now is None or op not in _WRITES:
        return None
    model = ReferenceModel()
    try:
        if op == "try_acquire_lock":
            model.try_acquire_lock(ctx, now)
        elif op == "set":
            status = IdempotencyStatus(request["status"])
            model.set(ctx, status, wire.decode_data(request.get("data_json")), now)
        elif op == "release_lock_as_failed":
            model.release_lock_as_failed(ctx, str(request.get("error_detail", "")), now)
        else:
            model.upsert(ctx, wire.decode_data(request.get("data_json")), now)
    except InstantOutOfRangeError as exc:
        return exc
    except (DsmError, ValueError, KeyError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class Change:
    """One change a version made that a handler of the version before would fail.

    ``kind`` is the error kind the version added; ``earlier_answer`` the kind
    a handler written to the earlier text gives for the same call (the earlier
    text had no better one); ``applies`` tells from the request (its op, its
    context, its ``now``) the model's error when that error is ``kind``, so
    the earlier answer can stand for it.
    """

    kind: str
    earlier_answer: str
    applies: Callable[
        [str, StateHandlerContext | None, dt.datetime | None, Mapping[str, Any]], Exception | None
    ]
    summary: str


INSTANT_OUT_OF_RANGE = Change(
    kind="instant_out_of_range",
    earlier_answer="internal",
    applies=past_the_last_instant,
    summary=(
        "an acquire or write whose now + lock_duration_us or now + retention_us is past "
        "9999-12-31T23:59:59.999999Z is answered with the error kind instant_out_of_range "
        "(fields option, now, duration); version 1 had no kind for it, so a handler answered "
        "internal"
    ),
)


@dataclass(frozen=True, slots=True)
class Version:
    """One version of the protocol: its number and what it changed from the one before."""

    number: int
    changes: tuple[Change, ...]


#: Every version this harness speaks, oldest first.
VERSIONS: tuple[Version, ...] = (
    Version(1, ()),
    Version(2, (INSTANT_OUT_OF_RANGE,)),
)
FIRST = VERSIONS[0].number
NEWEST = VERSIONS[-1].number
#: What ``open`` offers: every version spoken.
OFFER: tuple[int, ...] = tuple(v.number for v in VERSIONS)


def spoken(number: object) -> Version | None:
    """The version numbered ``number``, or None when this harness does not speak it."""
    if isinstance(number, bool) or not isinstance(number, int):
        return None
    return next((v for v in VERSIONS if v.number == number), None)


def with_offer(request: Mapping[str, Any]) -> dict[str, Any]:
    """An ``open`` request of a file (a replay, a transcript) with this harness's offer in it.

    The handshake is the harness's own: a file recorded by a harness that
    offered one version is sent offering every version spoken now, and the
    answers are read by the version the handler answers.
    """
    return {**request, "protocol": FIRST, "protocols": list(OFFER)}


def offered(protocol: object, protocols: object) -> tuple[int, ...]:
    """The versions an ``open`` request offers: its ``protocols`` list, else its ``protocol``."""
    if isinstance(protocols, list) and protocols:
        return tuple(n for n in protocols if isinstance(n, int) and not isinstance(n, bool))
    if isinstance(protocol, int) and not isinstance(protocol, bool):
        return (protocol,)
    return ()


def _later(version: int) -> Iterable[Change]:
    """The changes of the versions after ``version``: what its handlers were not written to."""
    for later in VERSIONS:
        if later.number > version:
            yield from later.changes


def earlier_reading(
    version: int,
    kind: str,
    op: str,
    ctx: StateHandlerContext | None,
    now: dt.datetime | None,
    request: Mapping[str, Any],
) -> Exception | None:
    """The model's error an answer of ``kind`` stands for under ``version``, or None.

    Under a version before a change, the answer the earlier text gave
    (``internal`` for an instant past year 9999 under version 1) agrees with
    the model where the change's kind would be the model's answer.
    """
    for change in _later(version):
        if kind == change.earlier_answer:
            error = change.applies(op, ctx, now, request)
            if error is not None:
                return error
    return None


def note(
    version: int,
    kind: str,
    op: str,
    ctx: StateHandlerContext | None,
    now: dt.datetime | None,
    request: Mapping[str, Any],
) -> str:
    """Under ``version``, what to say of an answer an earlier version gave for a change it made.

    Empty when the answer is not one a change replaced, so a finding names
    the change and what to do instead of only disagreeing.
    """
    for number in range(FIRST + 1, version + 1):
        this = spoken(number)
        for change in () if this is None else this.changes:
            if kind == change.earlier_answer and change.applies(op, ctx, now, request) is not None:
                return (
                    f"; protocol version {number} changed this answer: {change.summary}. The "
                    f"handler answered open with protocol {version} and is judged by that "
                    f"version's text: answer {change.kind} here, or answer open with protocol "
                    f"{number - 1} if it was written to version {number - 1}"
                )
    return ""


def judged_by(version: int) -> str:
    """What a verdict says of a handler judged by an earlier version; empty for the newest."""
    later = [change.kind for change in _later(version)]
    if not later:
        return ""
    return (
        f"the handler answered open with protocol version {version}, so it is judged by that "
        f"version's text: where a later version answers {', '.join(later)}, the answer "
        f"version {version} gave agrees (docs/protocol.md, Versions)"
    )


def agrees(version: int, expected_kind: str, got_kind: str) -> bool:
    """Whether an error answer of ``got_kind`` agrees with the model's ``expected_kind``.

    The same kind always agrees; under a version before a change, the
    earlier answer agrees with the kind the change added.
    """
    if got_kind == expected_kind:
        return True
    return any(
        change.kind == expected_kind and change.earlier_answer == got_kind
        for change in _later(version)
    )


def describe(versions: Sequence[int]) -> str:
    """A list of version numbers as a message shows it."""
    return ", ".join(str(n) for n in versions) or "none"
