"""What a race leaves undecided: the end of retention of a history row no read can show.

Two upserts racing a clock move can be explained by more than one reading of
the clock: the handler answers the same and shows the same current record
either way, yet the superseded row the first upsert wrote ends its retention
at different instants.  No ``get`` reads a superseded row, so only a later
retention sweep, by the number of records it expires, tells the explanations
apart.  Choosing one explanation for good would fail a correct handler whose
calls took the other (one that serialises its calls, for instance, reads the
clock for the second call after the move).

So the kit keeps, per history row, the other ends of retention some
explanation gives it, and a retention sweep whose count the model does not
match may adopt the first combination of those that explains the count.  A
value is dropped once a sweep has decided it: the row was expired, or the
value lies before a sweep that left the row alone.  Every value kept was the
result of an order the race allowed, so a handler is only ever excused by a
history it could have written.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from dsm_sim.model import ReferenceModel
from reference_engine.status import IdempotencyStatus

__all__ = ["HistoryDoubt"]

#: The combinations tried for one sweep; rows in doubt at once are few.
MAX_PATCHES = 64

Patch = dict[int, dt.datetime | None]


@dataclass(slots=True)
class HistoryDoubt:
    """Other possible ``retain_until`` values, by index into the model's superseded rows."""

    alternatives: dict[int, list[dt.datetime | None]] = field(default_factory=dict)

    def note(self, chosen: ReferenceModel, others: Iterable[ReferenceModel], since: int) -> None:
        """Remember where other explanations put the history rows written from ``since`` on."""
        for model in others:
            if len(model.superseded) != len(chosen.superseded):
                continue
            for index in range(since, len(chosen.superseded)):
                value = model.superseded[index].retain_until
                values = self.alternatives.setdefault(index, [])
                if value != chosen.superseded[index].retain_until and value not in values:
                    values.append(value)
                if not values:
                    del self.alternatives[index]

    def patches(self, model: ReferenceModel) -> Iterator[Patch]:
        """Combinations of other values for the rows still in doubt, the model's own first."""
        rows = [
            index
            for index in sorted(self.alternatives)
            if index < len(model.superseded)
            and model.superseded[index].status is not IdempotencyStatus.EXPIRED
        ]
        choices = [[model.superseded[i].retain_until, *self.alternatives[i]] for i in rows]
        for combination in itertools.islice(itertools.product(*choices), 1, MAX_PATCHES + 1):
            yield dict(zip(rows, combination, strict=True))

    @staticmethod
    def apply(model: ReferenceModel, patch: Patch) -> None:
        for index, value in patch.items():
            model.superseded[index].retain_until = value

    def settle(
        self, model: ReferenceModel, count: object, sweep: Callable[[ReferenceModel], int]
    ) -> None:
        """Before a sweep is judged: adopt the values that make the model expire ``count`` rows.

        Nothing changes when the model already agrees, or when no combination
        does (the sweep is then judged, and reported, on the model as it is).
        """
        if not self.alternatives or not isinstance(count, int):
            return
        if sweep(copy.deepcopy(model)) == count:
            return
        for patch in self.patches(model):
            probe = copy.deepcopy(model)
            self.apply(probe, patch)
            if sweep(probe) == count:
                self.apply(model, patch)
                return

    def prune(self, model: ReferenceModel, earliest: dt.datetime) -> None:
        """After a sweep at ``earliest`` or later: forget what it decided."""
        for index in list(self.alternatives):
            record = model.superseded[index] if index < len(model.superseded) else None
            if record is None or record.status is IdempotencyStatus.EXPIRED:
                del self.alternatives[index]
                continue
            kept = [v for v in self.alternatives[index] if v is None or v >= earliest]
            if kept:
                self.alternatives[index] = kept
            else:
                del self.alternatives[index]
