"""The architecture, read from the imports: the engine stands alone, and no module circles back.

``reference_engine`` is the engine a team deploys; ``dsm_sim`` is the harness
that verifies it.  The harness may import the engine, never the other way
round, so the engine installs and runs without a line of the harness.  And a
module that imports another which (directly or through others) imports it
back makes both one unit that can only be read, and loaded, together.

The graph is built from the source with :mod:`ast`, so it sees every import
statement, including those inside functions (a lazy import is still a
dependency), and modules named as strings to :func:`importlib.import_module`
are looked for too: naming a module is importing it by another route.  A
package named as the anchor of its data files (templates, assets) is not.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reference_engine", "dsm_sim")
#: A dotted module path of one of our packages inside a string (``"dsm_sim.x.y:attr"``).
_NAMED = re.compile(r"^(?:" + "|".join(PACKAGES) + r")(?:\.\w+)*(?=$|:)")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def _resolve(name: str) -> str | None:
    """The module of ours that ``name`` (a module, or a module's attribute) loads, if any."""
    known = modules()
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


#: Calls whose string argument names a package as the anchor of its data files
#: (``importlib.resources.files``, jinja's ``PackageLoader``), not as code to run.
_RESOURCE_ANCHORS = frozenset({"files", "PackageLoader"})


def _anchors(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _RESOURCE_ANCHORS:
                found.add(id(node.args[0]))
    return found


def _targets(module: str, tree: ast.AST, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module of ours that ``module`` imports, with the line that does it."""
    anchors = _anchors(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # ``from package import module`` imports the module; else the package.
                yield f"{base}.{alias.name}", node.lineno
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in anchors
        ):
            named = _NAMED.match(node.value)
            if named:
                yield named.group(0), node.lineno


@cache
def graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, over both packages."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found: dict[str, int] = {}
        for target, line in _targets(name, tree, path.name == "__init__.py"):
            resolved = _resolve(target)
            if resolved is not None and resolved != name:
                found.setdefault(resolved, line)
        edges[name] = found
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_sees_lazy_imports_and_modules_named_in_strings() -> None:
    """The check can fail: a function-level import and an importlib string are edges."""
    tree = ast.parse(
        "def later():\n    from dsm_sim.history import History\n"
        "COMMANDS = {'run': ('dsm_sim.simulator.cli', 'help')}\n"
        "FACTORY = 'reference_engine.handlers.memory:in_memory_handler'\n"
        "ASSETS = resources.files('dsm_sim.reports.explorer')\n"
    )
    found = {_resolve(t) for t, _ in _targets("reference_engine.example", tree, False)}
    assert found == {
        "dsm_sim.history",
        "dsm_sim.simulator.cli",
        "reference_engine.handlers.memory",
    }


def test_the_engine_imports_nothing_from_the_harness() -> None:
    offenders = [
        f"{modules()[module].relative_to(ROOT)}:{line}: imports {target}"
        for module, targets in sorted(graph().items())
        if module.startswith("reference_engine")
        for target, line in sorted(targets.items())
        if target.startswith("dsm_sim")
    ]
    assert not offenders, "reference_engine must not depend on dsm_sim:\n" + "\n".join(offenders)


def test_no_module_imports_one_that_imports_it_back() -> None:
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
