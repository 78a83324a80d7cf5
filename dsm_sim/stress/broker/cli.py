"""The ``--broker`` options of ``dsm stress`` and the run they start.

With ``--broker amqp://...`` the stress command stops delivering messages by
itself: it publishes them to RabbitMQ and lets N worker processes consume
them through the workflow engine and the invoice node, killing some of them
on the way (:mod:`dsm_sim.stress.broker`).  ``--workers`` is then each
process's prefetch, and ``--duplicates`` is not used: duplicate deliveries
come from ``--duplicate-publishes`` and from the broker's redeliveries.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from dsm_sim.options import bounded_int
from dsm_sim.stress.broker.runner import run_broker_stress
from dsm_sim.stress.broker.settings import BrokerStressSettings, KillPoint
from dsm_sim.stress.settings import StressSettings
from dsm_sim.stress.verdict import exit_code, run_each
from reference_engine.errors import DsmError

__all__ = ["BROKER_ENV", "DEFAULT_BROKER_LOCK_S", "add_broker_arguments", "broker_main"]

BROKER_ENV = "DSM_TEST_AMQP_URL"
#: The lock duration of a broker run unless --lock-duration says otherwise: a worker
#: killed holding a lock delays its item by this much, so 30 minutes would stall the run.
DEFAULT_BROKER_LOCK_S = 5.0
#: ``dsm stress``'s own --lock-duration default, which a broker run replaces.
_PLAIN_DEFAULT_LOCK_S = 1800.0


def _kill_points(text: str) -> tuple[KillPoint, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    allowed = ", ".join(p.value for p in KillPoint)
    try:
        return tuple(KillPoint(n) for n in names)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown kill point in {text!r}; allowed: {allowed} (comma-separated)"
        ) from None


def add_broker_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("real broker (RabbitMQ)")
    group.add_argument(
        "--broker",
        metavar="URL",
        help="consume through RabbitMQ, e.g. amqp://guest:guest@127.0.0.1:5672/: publish "
        "--keys invoices, run --processes workers through the engine and the invoice node, "
        "SIGKILL and restart some; --workers is then each worker's prefetch and "
        f"--lock-duration defaults to {DEFAULT_BROKER_LOCK_S:g}s",
    )
    group.add_argument(
        "--duplicate-publishes",
        type=bounded_int(0, 10_000_000),
        default=None,
        metavar="N",
        help="extra publishes of keys drawn from the seed (default: a quarter of --keys)",
    )
    group.add_argument(
        "--kills",
        type=bounded_int(0, 10_000),
        default=3,
        metavar="N",
        help="worker processes SIGKILLed at a kill point, then replaced (default 3)",
    )
    group.add_argument(
        "--kill-points",
        type=_kill_points,
        default=tuple(KillPoint),
        metavar="POINTS",
        help="comma-separated, used in turn: "
        + ", ".join(p.value for p in KillPoint)
        + " (default: all three)",
    )
    group.add_argument(
        "--ack-before-node",
        action="store_true",
        help="acknowledge each message before the node runs (a broken consumer, for "
        "--expect-violation: a kill then loses messages)",
    )


def broker_main(args: argparse.Namespace, databases: list[str]) -> int:
    """Run the broker stress run on each database; exit status as for ``dsm stress``."""
    lock_s = (
        DEFAULT_BROKER_LOCK_S if args.lock_duration == _PLAIN_DEFAULT_LOCK_S else args.lock_duration
    )
    try:
        plans = [
            BrokerStressSettings(
                stress=StressSettings(
                    db_url=url,
                    handler_spec=args.handler,
                    processes=args.processes,
                    workers=args.workers,
                    keys=args.keys,
                    duplicates=1,
                    fail_rate=args.fail_rate,
                    lock_duration=dt.timedelta(seconds=lock_s),
                    seed=args.seed,
                    fault_free=True,
                ),
                broker_url=args.broker,
                duplicate_publishes=args.keys // 4
                if args.duplicate_publishes is None
                else args.duplicate_publishes,
                kills=args.kills,
                kill_points=args.kill_points,
                ack_first=args.ack_before_node,
                timeout_s=args.timeout,
            )
            for url in databases
        ]
    except DsmError as exc:
        print(f"dsm stress: {exc}", file=sys.stderr)
        return 2
    reports = run_each(plans, lambda settings: run_broker_stress(settings, keep=args.keep))
    if reports is None:
        return 2
    return exit_code(reports, json_path=args.json, expect_violation=args.expect_violation)
