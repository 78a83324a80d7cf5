"""Plain-text rendering for ``dsm demo``: aligned tables, headings, abbreviated payloads.

The demo's output is read in CI logs and diffed between runs, so it is plain
ASCII with no colour, no terminal-width detection and no wall-clock values:
the same rows always render to the same bytes.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reference_engine.clock import ensure_utc
from reference_engine.config import DataStateMachineConfig
from reference_engine.context import StateHandlerContext
from reference_engine.engine.executor import NodeExecutionResult, NodeOutcome

__all__ = [
    "ELLIPSIS",
    "LogRow",
    "Narrator",
    "abbreviate",
    "config_lines",
    "context_lines",
    "describe_result",
    "flatten_data",
    "format_instant",
    "heading",
    "indent",
    "mapping_lines",
    "render_rows",
    "render_table",
]

#: ASCII, so the output survives any log viewer's encoding.
ELLIPSIS = "..."
DATA_WIDTH = 72
ERROR_WIDTH = 42
ROW_HEADERS = (
    "item_key",
    "status",
    "attempt",
    "locked_until",
    "updated_at",
    "entity_execution_id",
    "error_detail",
    "data",
)


@dataclass(frozen=True, slots=True)
class LogRow:
    """One row of ``process_state_logs`` as the demo shows it."""

    item_key: str
    status: str
    attempt: int
    locked_until: dt.datetime | None
    updated_at: dt.datetime
    entity_execution_id: str
    error_detail: str | None
    data: str | None


def format_instant(instant: dt.datetime | None) -> str:
    """``HH:MM:SS`` in UTC; the demo states the date once, every row is on that day."""
    if instant is None:
        return "-"
    return ensure_utc(instant).strftime("%H:%M:%S")


def abbreviate(text: str | None, width: int) -> str:
    """Cut ``text`` to ``width`` characters, marking the cut; ``None`` shows as ``-``."""
    if text is None:
        return "-"
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return flat[: max(width - len(ELLIPSIS), 0)] + ELLIPSIS


def _leaves(value: Any, path: str, out: list[tuple[str, str, Any]]) -> None:
    if isinstance(value, Mapping) and value:
        for key in sorted(value):
            _leaves(value[key], f"{path}.{key}" if path else str(key), out)
    else:
        out.append((path, path.rsplit(".", 1)[-1], value))


def flatten_data(data: str | None) -> str | None:
    """Stored JSON as ``key=value`` leaves, the shortest spelling that still shows the values.

    Leaves are named by their own key (``chargeId``), or by their dotted path
    when two leaves share a name, so nothing shown is ambiguous.
    """
    if data is None:
        return None
    try:
        decoded: Any = json.loads(data)
    except ValueError:
        return data
    if not isinstance(decoded, Mapping) or not decoded:
        return json.dumps(decoded, ensure_ascii=True)
    leaves: list[tuple[str, str, Any]] = []
    _leaves(decoded, "", leaves)
    names = [name for _, name, _ in leaves]
    unique = len(set(names)) == len(names)
    return " ".join(
        f"{name if unique else path}="
        f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=True)}"
        for path, name, value in leaves
    )


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """An aligned text table: header, a rule, one line per row; right-trimmed lines."""
    widths = [len(h) for h in headers]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(cells)).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def render_rows(rows: Sequence[LogRow]) -> list[str]:
    """The ``process_state_logs`` table, or a one-line note when it has no rows."""
    if not rows:
        return ["(no rows)"]
    cells = [
        [
            row.item_key,
            row.status,
            str(row.attempt),
            format_instant(row.locked_until),
            format_instant(row.updated_at),
            row.entity_execution_id,
            abbreviate(row.error_detail, ERROR_WIDTH),
            abbreviate(flatten_data(row.data), DATA_WIDTH),
        ]
        for row in rows
    ]
    return render_table(ROW_HEADERS, cells)


def heading(number: int, title: str) -> list[str]:
    """A numbered step heading with a blank line before it."""
    text = f"Step {number}. {title}"
    return ["", text, "=" * len(text)]


def indent(lines: Sequence[str] | str, prefix: str = "  ") -> list[str]:
    """Indent a block (a string is split into lines first)."""
    source = lines.splitlines() if isinstance(lines, str) else lines
    return [f"{prefix}{line}".rstrip() for line in source]


def mapping_lines(values: Mapping[str, object]) -> list[str]:
    """``key  value`` lines with the values aligned."""
    width = max((len(k) for k in values), default=0)
    return [f"{key.ljust(width)}  {value}" for key, value in values.items()]


def config_lines(config: DataStateMachineConfig) -> list[str]:
    """A parsed ``dataStateMachine`` block, one aligned line per field."""
    return mapping_lines(
        {
            "handler": config.handler,
            "scope": f"{config.scope.code} (scope_id {int(config.scope)})",
            "lockDuration": config.handler_config.lock_duration,
            "retention": config.handler_config.retention,
        }
    )


def context_lines(ctx: StateHandlerContext) -> list[str]:
    """The base context a node's machine is built with, one aligned line per field."""
    return mapping_lines(
        {
            "tenant_id": ctx.tenant_id,
            "source_app_id": ctx.source_app_id,
            "scope_id": ctx.scope_id,
            "scope_code": ctx.scope_code,
            "entity_id": ctx.entity_id,
            "entity_execution_id": ctx.entity_execution_id,
            "lock_duration": ctx.handler_config.lock_duration,
            "retention": ctx.handler_config.retention,
        }
    )


def describe_result(result: NodeExecutionResult) -> str:
    """One line for a node result; a success shows the charge the node reported."""
    if result.outcome is NodeOutcome.SUCCESS and result.output is not None:
        response = result.output.get("response", {})
        return f"success: charged {response.get('chargeId')} for {response.get('amount')} cents"
    detail = result.error if result.outcome is NodeOutcome.FAILURE else result.reason
    return f"{result.outcome.value}: {detail}"


class Narrator:
    """Writes lines as they come and keeps them; records every claim the store contradicts."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self.lines: list[str] = []
        self.problems: list[str] = []

    def say(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(line)
            self._write(line)

    def block(self, lines: Sequence[str]) -> None:
        self.say(*lines)

    def expect(self, condition: bool, claim: str) -> None:
        if not condition:
            self.problems.append(claim)
            self.say(f"  !! UNEXPECTED: {claim}")
