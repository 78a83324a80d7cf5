"""A test case as data: the steps a machine took, with their arguments, printed once at the end.

Every step a conformance machine takes (a rule Hypothesis draws, a step of an
edge probe or of the race matrix) is recorded as a :class:`Call`: the step's
name and the values it was called with.  A failing run is therefore a
:class:`Program` from the moment it is generated: the runner replays it,
:mod:`dsm_sim.conformance.tell.trim` deletes steps from it, and only the
report turns it into text, a Python program a handler author pastes and
runs.  Nothing is parsed back from printed text.

Values print as the expressions that build them (the kit's enums, worlds
and items have such reprs); a long run of one character prints as a
product (``'x' * 262128``), so a payload at the size limit reads in one line.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HEADER", "Call", "Program", "expression"]

#: The imports every printed program starts with: the names its arguments use.
HEADER: tuple[str, ...] = (
    "from dsm_sim.conformance.execute.machine import build_machine",
    "import datetime",
    "from dsm_sim.conformance.execute.spellings import KeyText",
    "from dsm_sim.conformance.generate.steps import (",
    "    ClockMove, Instant, LandedWrite, NodeCall, RaceOp, RefusedKey, StartState,",
    ")",
    "from dsm_sim.conformance.generate.worlds import Role, World",
    "from dsm_sim.model import ItemRef",
    "from reference_engine.config import HandlerConfig",
    "from reference_engine.scope import Scope",
    "from reference_engine.status import IdempotencyStatus",
)
_INDENT = "    "
#: A string with a run of one character longer than this prints as a product.
_RUN = 64


def expression(value: object) -> str:
    """Python source that builds ``value``: its repr, with long runs of text as products."""
    if isinstance(value, str) and type(value) is str:
        return _text(value)
    if isinstance(value, dict) and type(value) is dict:
        inner = ", ".join(f"{expression(k)}: {expression(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, list) and type(value) is list:
        return "[" + ", ".join(expression(v) for v in value) + "]"
    if isinstance(value, tuple) and type(value) is tuple:
        items = ", ".join(expression(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    return repr(value)


#: Values of these types are never changed in place: a copy of one is the value itself.
_ATOMIC: frozenset[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes, dt.datetime, dt.date, dt.timedelta}
)


def _unchangeable(value: object) -> bool:
    """Nothing can change ``value`` in place: atoms, enum members, tuples and frozen dataclasses of such.

    Every step's arguments are copied when it is recorded and again when it is
    replayed (a handler may change a payload it was given); most of them are
    workers, roles, enum members and worlds, whose copies cost far more than
    the step's own work and are equal to the value they copy.
    """
    kind = type(value)
    if kind in _ATOMIC or isinstance(value, enum.Enum):
        return True
    if kind is tuple:
        return all(_unchangeable(item) for item in value)  # type: ignore[attr-defined]
    if isinstance(value, str):
        return not getattr(value, "__dict__", None)  # a subclass with state of its own is copied
    params = getattr(kind, "__dataclass_params__", None)
    if params is None or not params.frozen:
        return False
    return all(_unchangeable(getattr(value, f.name)) for f in dataclasses.fields(value))  # type: ignore[arg-type]


def _copy(value: Any) -> Any:
    """A deep copy of ``value``, or the value itself where nothing can change it in place."""
    return value if _unchangeable(value) else copy.deepcopy(value)


def _text(value: str) -> str:
    head = value[:1]
    run = len(value) - len(value.lstrip(head)) if head else 0
    if run <= _RUN:
        return repr(value)
    tail = value[run:]
    return f"{head!r} * {run}" + (f" + {_text(tail)}" if tail else "")


@dataclass(frozen=True, slots=True)
class Call:
    """One step: the machine's method ``rule`` called with ``arguments`` (in order)."""

    rule: str
    arguments: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, rule: str, **arguments: Any) -> Call:
        return cls(rule, tuple((k, _copy(v)) for k, v in arguments.items()))

    def kwargs(self) -> dict[str, Any]:
        """The arguments, copied: a handler may change a payload it was given in place."""
        return {key: _copy(value) for key, value in self.arguments}

    def argument(self, name: str, default: Any = None) -> Any:
        return dict(self.arguments).get(name, default)

    def replaced(self, **changes: Any) -> Call:
        """The call with some arguments changed (others kept, in order)."""
        kept = tuple((k, changes.pop(k)) if k in changes else (k, v) for k, v in self.arguments)
        return Call(self.rule, kept + tuple(changes.items()))

    def render(self) -> str:
        shown = ", ".join(f"{key}={expression(value)}" for key, value in self.arguments)
        return f"state.{self.rule}({shown})"

    def run_on(self, state: object) -> None:
        getattr(state, self.rule)(**self.kwargs())


@dataclass(frozen=True, slots=True)
class Program:
    """The steps of one test case, the first of which enters its world (``setup``)."""

    steps: tuple[Call, ...]
    #: Where the clock stood before each step ran, when the machine recorded it (not
    #: printed, not compared): what lets trimming fast-forward past a prefix.
    instants: tuple[dt.datetime, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.steps or self.steps[0].rule not in ("setup", "enter_world"):
            raise ValueError("a program starts by entering its world (setup)")

    @property
    def setup(self) -> Call:
        return self.steps[0]

    @property
    def body(self) -> tuple[Call, ...]:
        """The steps after ``setup``: what trimming may delete."""
        return self.steps[1:]

    def with_body(self, body: Sequence[Call]) -> Program:
        return Program((self.setup, *body))

    def fast_forwarded(self, index: int) -> Program | None:
        """The program from body step ``index`` on, the clock jumped to where it stood then.

        The steps before are gone with what they wrote; a failure that needed
        only the time they took (a lock that crosses midnight) keeps failing.
        """
        if len(self.instants) != len(self.steps) or not 0 < index < len(self.body):
            return None
        jump = Call.of("clock_jumps_to", instant=self.instants[index + 1])
        return Program((self.setup, jump, *self.body[index:]))

    def folded(self) -> Program:
        """A leading ``enter_world`` becomes the program's ``setup``: one world, one step less.

        A trimmed chain of worlds often starts by entering the one it needs
        from a first one where nothing happened.
        """
        body = self.body
        if not body or body[0].rule != "enter_world":
            return self
        return Program((Call("setup", body[0].arguments), *body[1:]))

    def render(
        self,
        factory_path: str,
        *,
        machine_name: str = "HandlerConformance",
        semantics: str | None = None,
        options: Mapping[str, object] | None = None,
    ) -> str:
        """The program a handler author pastes and runs: imports, the machine, every step.

        The steps run inside ``try`` with ``state.teardown()`` in ``finally``: a
        violation raised half-way must still close the handler, or a store
        that made a schema or key prefix for the run keeps it.  ``semantics``
        names the profile the run was judged by, when it was given rather
        than declared; ``options`` are further keywords of ``build_machine``.
        """
        module, _, attr = factory_path.partition(":")
        extra = f", semantics={semantics!r}" if semantics is not None else ""
        for key, value in (options or {}).items():
            extra += f", {key}={value!r}"
        lines = list(HEADER)
        if module and attr and "<" not in attr:
            lines.append(f"from {module} import {attr.split('.')[0]}")
            built = attr
        else:
            built = "your_factory"
        lines.append(f"{machine_name} = build_machine({built}, name={machine_name!r}{extra})")
        lines.append(f"state = {machine_name}()")
        lines.append("try:")
        lines += [_INDENT + call.render() for call in self.steps]
        lines += ["finally:", _INDENT + "state.teardown()"]
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.steps)
