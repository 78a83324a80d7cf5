"""Which test a counterexample is printed as: one printer per language, chosen by the handler.

A handler behind the protocol says its language on ``open`` (``"language":
"csharp"``, ``"node"``, ``"java"``); a handler that says nothing is known by
its command (``mono``, ``dotnet``, ``node``, ``java``).  Each printer spells
the same :class:`Finding` (the replay's lines, which were in flight together,
the handler's answers and shape, the ``--tokens`` rule: everything its
protocol steps are made from, :mod:`~dsm_sim.conformance.tell.steps`) as a
test of its language's own runner, written beside the replay file with the
printer's suffix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsm_sim.conformance.tell.csharp import is_csharp, nunit_test
from dsm_sim.conformance.tell.java import is_java, java_test
from dsm_sim.conformance.tell.node import is_node, node_test
from dsm_sim.conformance.tell.steps import Finding

__all__ = ["PRINTERS", "Finding", "TestPrinter", "printer_for"]


@dataclass(frozen=True, slots=True)
class TestPrinter:
    """How findings become tests in one language."""

    #: The language, as a reader names it.
    language: str
    #: What the printed text is, for the line that introduces it.
    kind: str
    #: The file name's ending beside the replay file (``stale_write_rejected-seed0`` + suffix).
    suffix: str
    #: Whether a handler of this command, whose host said this language, is written in it.
    recognises: Callable[[str, str | None], bool]
    #: The test's source text.
    render: Callable[[Finding], str]


#: Every printer, tried in this order.
PRINTERS: tuple[TestPrinter, ...] = (
    TestPrinter("C#", "an NUnit test for your C# test project", ".cs", is_csharp, nunit_test),
    TestPrinter("Node", "a node:test file (node --test)", ".test.js", is_node, node_test),
    TestPrinter(
        "Java", "a Java class whose main throws AssertionError", ".java", is_java, java_test
    ),
)


def printer_for(command: str, language: str | None) -> TestPrinter | None:
    """The printer for a handler run by ``command`` whose host said ``language``; None: none."""
    return next((p for p in PRINTERS if p.recognises(command, language)), None)
