"""``dsm diagram``: print the state diagram generated from the transition table."""

from __future__ import annotations

import argparse

from reference_engine.status import TRANSITIONS, mermaid_state_diagram

__all__ = ["configure", "main", "transition_table_markdown"]


def transition_table_markdown() -> str:
    """The transition table as a Markdown table (one row per source status)."""
    rows = ["| from | may become |", "| --- | --- |"]
    for source, targets in TRANSITIONS.items():
        names = ", ".join(
            t.label for t in sorted(targets, key=lambda s: list(TRANSITIONS).index(s))
        )
        rows.append(f"| {source.label} | {names} |")
    return "\n".join(rows)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=("mermaid", "table"), default="mermaid", help="output format"
    )


def main(args: argparse.Namespace) -> int:
    print(mermaid_state_diagram() if args.format == "mermaid" else transition_table_markdown())
    return 0
