"""Broken handlers that do not give back the data and details they were given.

They pass small payloads like ``{"amount": 3}``; they fail on the rest of
the documented domain: NUL in a string, integers past 2**53, floats that
need 17 digits, error details of 4000 characters outside ASCII.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reference_engine.context import StateHandlerContext
from reference_engine.errors import StoreError
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.record import MAX_ERROR_DETAIL, encode_data
from reference_engine.status import IdempotencyStatus

__all__ = [
    "DropsEmptyValues",
    "ErrorDetailTrimmed",
    "ErrorDetailTruncatedInBytes",
    "FloatsToFifteenDigits",
    "IntegersClampedToDecimal65",
    "JsonbRefusesNul",
    "NumbersAsDoubles",
]


class _Rewriting(InMemoryStateHandler):
    """Stores ``rewrite(data)`` instead of ``data``."""

    def rewrite(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {key: self.rewrite(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.rewrite(item) for item in value]
        return self.scalar(value)

    def scalar(self, value: Any) -> Any:
        return value

    def _data(self, data: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return None if data is None else self.rewrite(data)

    async def set(
        self,
        ctx: StateHandlerContext,
        status: IdempotencyStatus,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.model.set(ctx, status, self._data(data), self.clock.now())

    async def upsert(self, ctx: StateHandlerContext, data: Mapping[str, Any] | None) -> None:
        self.model.upsert(ctx, self._data(data), self.clock.now())


class NumbersAsDoubles(_Rewriting):
    """Numbers go through a double, as in JavaScript: integers past 2**53 lose their last digits."""

    def scalar(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
            return float(value)
        return value


class FloatsToFifteenDigits(_Rewriting):
    """Floats are stored with 15 significant digits, as a ``%.15g`` format or a ``float8`` cast to text does."""

    def scalar(self, value: Any) -> Any:
        return float(f"{value:.15g}") if isinstance(value, float) else value


class JsonbRefusesNul(_Rewriting):
    """Data is stored in a ``jsonb`` column, which refuses ``\\u0000`` in strings."""

    def _data(self, data: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        text = encode_data(data)
        if text is not None and "\\u0000" in text:
            raise StoreError(
                "unsupported Unicode escape sequence: \\u0000 cannot be converted to text"
            )
        return data


class ErrorDetailTruncatedInBytes(InMemoryStateHandler):
    """The error detail column holds 4000 bytes, not 4000 characters: long non-ASCII details are cut."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        cut = error_detail.encode("utf-8")[:MAX_ERROR_DETAIL].decode("utf-8", "ignore")
        self.model.release_lock_as_failed(ctx, cut, self.clock.now())


class DropsEmptyValues(_Rewriting):
    """Empty lists and objects inside the data are left out, as a mapper that omits empty attributes does."""

    def rewrite(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            kept = {key: self.rewrite(item) for key, item in value.items() if not _empty(item)}
            return kept
        if isinstance(value, list | tuple):
            return [self.rewrite(item) for item in value if not _empty(item)]
        return value


def _empty(value: Any) -> bool:
    return isinstance(value, Mapping | list | tuple) and not value


#: The largest integer a ``DECIMAL(65, 0)`` column holds.
_DECIMAL65 = 10**65 - 1


class IntegersClampedToDecimal65(_Rewriting):
    """Integers are stored in a ``DECIMAL(65)`` column, which clamps longer ones to 65 nines."""

    def scalar(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return max(-_DECIMAL65, min(_DECIMAL65, value))
        return value


class ErrorDetailTrimmed(InMemoryStateHandler):
    """The error detail is stored trimmed (a ``CHAR`` column, a ``strip()``): blank and padded details change."""

    async def release_lock_as_failed(self, ctx: StateHandlerContext, error_detail: str) -> None:
        self.model.release_lock_as_failed(ctx, error_detail.strip(), self.clock.now())
