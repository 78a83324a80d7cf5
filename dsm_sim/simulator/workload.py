"""What a run delivers: the workflow's nodes, the items, their keys and payloads, the messages.

Keys and payloads come in two styles.  Plain keys are invoice numbers.
Varied keys are chosen to differ only in ways stores get wrong: case,
surrounding whitespace, Unicode NFC against NFD, full-width letters, and
characters that mean something to SQL, Redis, JSON or a path, and
characters outside Latin-1.  A store that trims, folds, normalises or
re-encodes a key makes two of them share a record.  Varied
payloads cover the JSON domain the engine documents: NUL inside strings, the
largest and smallest floats, negative zero, integers past 64 bits, deep
nesting, integers past 38 digits, empty containers and keys, quotes and
SQL text.  Both are fixed
lists, the same for every seed, so a failure replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsm_sim.scenario import KeyStyle, NodeKind, NodeSpec, PayloadStyle, Scenario
from reference_engine.context import MAX_KEY_LENGTH
from reference_engine.engine.definitions import Element
from reference_engine.engine.executor import Message
from reference_engine.nodes import approval, correction, invoice, screening

__all__ = [
    "APP",
    "VARIED_KEYS",
    "VARIED_TENANTS",
    "WORKFLOW",
    "Delivery",
    "element_of",
    "invoice_ids",
    "nodes_of",
    "payload_details",
    "tenant_ids",
    "workload",
]

APP = "app-1"
WORKFLOW = "billing"
#: The node a scenario without ``[[nodes]]`` runs (its id is in every older history).
DEFAULT_NODE_ID = "invoice-dispatch-1"

#: Item keys that a faithful store keeps apart; each group differs only in one way.
VARIED_KEYS: tuple[str, ...] = (
    "INV-0001",
    "inv-0001",
    "k" * 251 + "-0001",  # 256 characters, the limit: a shorter key column cuts these two
    "k" * 251 + "-0002",
    " INV-0001",
    "INV-0001 ",
    "caf\u00e9-0002",  # NFC
    "cafe\u0301-0002",  # NFD: reads the same, is not the same key
    "\uff29\uff2e\uff36-0003",  # full-width INV
    "INV-0003",
    "O'Brien\"; DROP TABLE process_state_logs; --",
    '{"$gt": ""}',
    "key:with:colons*?[x]{y}",
    "tab\tand\nnewline",
    "100%_done\\",
    "a/b/c",
    "\u01c5-title-case",
    "\U0001f4b6-euro",
    "\u20ac-0004",  # outside Latin-1, like the next: a Latin-1 column makes both "?-0004"
    "\u0152-0004",
)

#: Tenant ids that a faithful store keeps apart (case, space, NFC/NFD), for varied keys.
VARIED_TENANTS: tuple[str, ...] = (
    "tenant-a",
    "Tenant-A",
    "tenant-a ",
    "tenant-\u00e9",
    "tenant-e\u0301",
    "TENANT-B",
    "tenant-b",
    "t",
    "T",
    "tenant:c",
)

_TYPES = {
    NodeKind.INVOICE: invoice.NODE_TYPE,
    NodeKind.CORRECTION: correction.NODE_TYPE,
    NodeKind.SCREENING: screening.NODE_TYPE,
    NodeKind.APPROVAL: approval.NODE_TYPE,
}

#: The applications approval messages come from: a store that stamps the first one it saw,
#: or keeps the creating call's, disagrees with the model on a later write.
SOURCE_APPS: tuple[str, ...] = (APP, "app-2", "portal-\u00e9")
#: Reasons a business declines a payment with, verbatim: empty, blank, non-ASCII, multi-line.
DECLINE_REASONS: tuple[str, ...] = (
    "",
    " ",
    "card declined: e\u0301 \U0001f4b6",
    "line one\nline two",
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message to deliver, the node it is for, and the key it is mainly about."""

    message: Message
    node: str
    #: (tenant, item key, item entity key) of the record the message is mainly about.
    item: tuple[str, str, str]


def nodes_of(scenario: Scenario) -> tuple[NodeSpec, ...]:
    """The scenario's nodes; one invoice node with the run's lock duration by default."""
    if scenario.nodes:
        return scenario.nodes
    return (NodeSpec(DEFAULT_NODE_ID, NodeKind.INVOICE, "Element", scenario.lock_duration),)


def element_of(node: NodeSpec) -> Element:
    options: dict[str, Any] = {"lockDuration": node.lock_duration}
    options["retention"] = "30d" if node.retention == 30 * 86400.0 else node.retention
    settings = {"dataStateMachine": {"handler": "sim", "scope": node.scope, "options": options}}
    return Element(id=node.id, workflow_id=WORKFLOW, node_type=_TYPES[node.kind], settings=settings)


def invoice_ids(scenario: Scenario) -> list[str]:
    """One id per invoice number (tenants share numbers, so a key without tenant collides)."""
    count = -(-scenario.items // scenario.tenants)
    if scenario.keys is KeyStyle.PLAIN:
        return [f"inv-{n + 1:04d}" for n in range(count)]
    size = len(VARIED_KEYS)
    return [_fit(VARIED_KEYS[n % size], "" if n < size else f"~{n // size}") for n in range(count)]


def _fit(key: str, suffix: str) -> str:
    """``key + suffix`` within the engine's key limit, cutting the key rather than the suffix."""
    return key[: MAX_KEY_LENGTH - len(suffix)] + suffix


def tenant_ids(scenario: Scenario) -> list[str]:
    if scenario.keys is KeyStyle.PLAIN:
        return [f"tenant-{n + 1}" for n in range(scenario.tenants)]
    return list(VARIED_TENANTS[: scenario.tenants])


def _nested(depth: int) -> Mapping[str, Any]:
    value: dict[str, Any] = {"leaf": [depth, -depth, depth / 7]}
    for level in range(depth):
        value = {f"level{level}": value}
    return value


def payload_details(style: PayloadStyle, n: int) -> Mapping[str, Any]:
    """The details object a message carries into the stored data."""
    if style is PayloadStyle.PLAIN:
        return {"note": f"invoice {n}"}
    return {
        "memo": f"line one\x00line two {n}",
        "largest": 1.7976931348623157e308,
        "smallest": 5e-324,
        "tenth_plus_fifth": 0.1 + 0.2,
        "negative_zero": -0.0,
        "past_64_bits": 2**70 + n,
        "past_38_digits": 10**40 + n,
        "past_65_digits": -(10**70) - n,
        "min_int64": -(2**63),
        "nested": _nested(16),
        "unicode": "e\u0301 \u00e9 \U0001f4b6 \u202e",
        "empty": {"": "", "list": [], "object": {}},
        "mixed": [None, True, False, 0, "", [[]], {"k": None}],
        "quotes": "'\"\\ `${x}` %s {0}",
        "sql": "'); DELETE FROM process_state_logs; --",
        "key with spaces": n,
    }


def workload(scenario: Scenario, seed: int, rng: random.Random) -> list[tuple[float, Delivery]]:
    """Every message of the run with its arrival time, in arrival order.

    A run with only the default invoice node draws arrivals exactly as it
    always has, so its histories do not move.
    """
    ids = invoice_ids(scenario)
    tenants = tenant_ids(scenario)
    items = [
        (tenants[i % scenario.tenants], ids[i // scenario.tenants]) for i in range(scenario.items)
    ]
    nodes = nodes_of(scenario)
    if not scenario.nodes:
        arrivals = sorted((round(rng.uniform(0, scenario.arrival_window), 6), it) for it in items)
        node = nodes[0]
        return [
            (
                at,
                Delivery(
                    Message(
                        id=f"msg-{tenant}-{item}",
                        payload={"invoiceId": item, "amount": 100 * n},
                        tenant_id=tenant,
                        source_app_id=APP,
                    ),
                    node.id,
                    (tenant, item, ""),
                ),
            )
            for n, (at, (tenant, item)) in enumerate(arrivals, start=1)
        ]
    lines_rng = random.Random(f"{seed}/lines")
    approval_rng = random.Random(f"{seed}/approval")
    planned: list[tuple[float, int, Delivery]] = []
    lock_free = set(tenants[len(tenants) - scenario.lock_free_tenants :])
    for n, (tenant, item) in enumerate(items, start=1):
        details = payload_details(scenario.payloads, n)
        for node in nodes:
            if tenant in lock_free:
                if node.kind is NodeKind.APPROVAL:
                    at = round(rng.uniform(0, scenario.arrival_window), 6)
                    amends = _amendments(node, tenant, item, n, details, approval_rng)
                    planned.extend((at, len(planned) + i, d) for i, d in enumerate(amends))
                continue  # a tenant that never takes a lock has only its amendments
            if node.kind is NodeKind.APPROVAL:
                # The approval arrives in the window, the rest shortly after it, each
                # group at one instant: they race the approval's lock and each other.
                start = round(rng.uniform(0, scenario.arrival_window), 6)
                for later, group in _approval_messages(
                    node, tenant, item, n, details, approval_rng
                ):
                    at = round(start + later, 6)
                    planned.extend((at, len(planned) + i, d) for i, d in enumerate(group))
                continue
            for delivery in _messages(node, tenant, item, n, details, lines_rng):
                at = round(rng.uniform(0, scenario.arrival_window), 6)
                planned.append((at, len(planned), delivery))
    planned.sort(key=lambda p: (p[0], p[1]))
    return [(at, delivery) for at, _, delivery in planned]


def _messages(
    node: NodeSpec,
    tenant: str,
    item: str,
    n: int,
    details: Mapping[str, Any],
    rng: random.Random,
) -> list[Delivery]:
    base = f"msg-{tenant}-{node.id}-{item}"
    if node.kind is NodeKind.INVOICE:
        payload: dict[str, Any] = {"invoiceId": item, "amount": 100 * n}
        return [_delivery(base, payload, tenant, node, (tenant, item, ""))]
    if node.kind is NodeKind.CORRECTION:
        return [
            _delivery(
                f"{base}-r{rev}",
                {"invoiceId": item, "revision": rev, "amount": 100 * n + rev, "details": details},
                tenant,
                node,
                (tenant, item, correction.revision_key(rev)),
            )
            for rev in range(1, node.revisions + 1)
        ]
    lines = []
    for j in range(1, node.lines + 1):
        draw = rng.random()
        amount = 0 if draw < 0.2 else -5 if draw < 0.3 else 10 * j + n
        lines.append({"id": _fit(item, f":L{j}"), "amount": amount})
    payload = {"invoiceId": item, "lines": lines, "details": details}
    return [_delivery(base, payload, tenant, node, (tenant, str(lines[0]["id"]), item))]


def _approval_messages(
    node: NodeSpec,
    tenant: str,
    item: str,
    n: int,
    details: Mapping[str, Any],
    rng: random.Random,
) -> list[tuple[float, list[Delivery]]]:
    """An approve, maybe a waive, a confirm and ``revisions`` amendments arriving together.

    Each group comes with its delay after the approve: up to twice the
    node's lock duration, so it lands while the lock is live, once it has
    expired, or after the item was decided.  Every third item is approved
    with empty details; the first amendment of each item writes an empty
    object, the later ones the item's details, so both ``{}`` and the full
    payload domain are written by set and by upsert; even-numbered later
    amendments merge into the data they read.
    """
    base = f"msg-{tenant}-{node.id}-{item}"
    key = (tenant, item, "")

    def one(suffix: str, action: str, extra: Mapping[str, Any]) -> Delivery:
        payload = {"itemId": item, "action": action, "amount": 10 * n, **extra}
        app = SOURCE_APPS[rng.randrange(len(SOURCE_APPS))]
        return _delivery(f"{base}-{suffix}", payload, tenant, node, key, app)

    approve: dict[str, Any] = {"details": {} if n % 3 == 0 else dict(details)}
    if rng.random() < 0.3:
        approve["decline"] = DECLINE_REASONS[rng.randrange(len(DECLINE_REASONS))]
    groups = [(0.0, [one("approve", "approve", approve)])]

    def later() -> float:
        return round(rng.uniform(0, 2 * node.lock_duration), 6)

    if rng.random() < 0.5:
        groups.append((later(), [one("waive", "waive", {})]))
    if rng.random() < 0.5:
        groups.append((later(), [one("confirm", "confirm", {"details": dict(details)})]))
    if rng.random() < 0.6:
        amends = [
            one(
                f"amend{rev}",
                "amend",
                {"details": {}}
                if rev == 1
                else {"details": {**details, "rev": rev}, "merge": rev % 2 == 0},
            )
            for rev in range(1, node.revisions + 1)
        ]
        groups.append((later(), amends))
    return groups


def _amendments(
    node: NodeSpec,
    tenant: str,
    item: str,
    n: int,
    details: Mapping[str, Any],
    rng: random.Random,
) -> list[Delivery]:
    """A lock-free tenant's item: ``revisions`` amendments arriving together, nothing else.

    The first writes the item (an upsert of an item never seen), each later
    one supersedes it; no call of the tenant's ever takes a lock.
    """
    base = f"msg-{tenant}-{node.id}-{item}"
    return [
        _delivery(
            f"{base}-amend{rev}",
            {
                "itemId": item,
                "action": "amend",
                "amount": 10 * n,
                "details": {**details, "rev": rev},
            },
            tenant,
            node,
            (tenant, item, ""),
            SOURCE_APPS[rng.randrange(len(SOURCE_APPS))],
        )
        for rev in range(1, node.revisions + 1)
    ]


def _delivery(
    message_id: str,
    payload: Mapping[str, Any],
    tenant: str,
    node: NodeSpec,
    item: tuple[str, str, str],
    app: str = APP,
) -> Delivery:
    message = Message(id=message_id, payload=payload, tenant_id=tenant, source_app_id=app)
    return Delivery(message, node.id, item)
