"""A protocol handler frozen at one protocol version, on the reference in-memory store.

Run as ``frozen_version_handler.py VERSION OVERFLOW [CRASH_ITEM]``:

* ``VERSION`` ``1``: written to version 1, it reads no ``protocols`` and
  repeats the ``protocol`` of ``open``.  ``2``: it answers 2 when ``open``
  offers it, else refuses ``open`` as a bad request.  Any other number: it
  answers that number, whatever was offered.
* ``OVERFLOW``: how it answers an instant past year 9999, ``internal`` (what
  version 1's text left a handler, which had no kind for it) or
  ``instant_out_of_range`` (version 2's kind).
* ``CRASH_ITEM``: every call on this item key is answered ``internal``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from dsm_sim.protocol import wire
from reference_engine.clock import ManualClock
from reference_engine.errors import DsmError, InstantOutOfRangeError
from reference_engine.handlers.memory import InMemoryStateHandler
from reference_engine.status import IdempotencyStatus


def _open(request: dict[str, Any], version: int) -> dict[str, Any]:
    if version == 1:
        answered = request["protocol"]
    elif version == 2:
        if 2 not in request.get("protocols", [request["protocol"]]):
            raise ValueError(f"this handler speaks protocol 2; open offered {request}")
        answered = 2
    else:
        answered = version
    return {"protocol": answered, "concurrent": False, "name": f"frozen at {version}"}


async def _call(handler: InMemoryStateHandler, request: dict[str, Any]) -> Any:
    op = request["op"]
    if op == "close":
        return None
    if op == "reset_expired_locks":
        return await handler.reset_expired_locks()
    if op == "expire_past_retention":
        return await handler.expire_past_retention()
    ctx = wire.decode_context(request["context"])
    data = wire.decode_data(request.get("data_json"))
    if op == "exists":
        return await handler.exists(ctx)
    if op == "get":
        record = await handler.get(ctx)
        return None if record is None else wire.encode_record(record)
    if op == "try_acquire_lock":
        return await handler.try_acquire_lock(ctx)
    if op == "set":
        await handler.set(ctx, IdempotencyStatus(request["status"]), data)
    elif op == "release_lock_as_failed":
        await handler.release_lock_as_failed(ctx, request["error_detail"])
    else:
        await handler.upsert(ctx, data)
    return None


async def main(version: int, overflow: str, crash_item: str | None) -> None:
    clock = ManualClock()
    handler = InMemoryStateHandler(clock)
    await handler.open()
    for line in sys.stdin:
        request = json.loads(line)
        answer: dict[str, Any] = {"id": request["id"]}
        clock.set(wire.decode_instant(request["now"]))
        try:
            if request["op"] == "open":
                answer["result"] = _open(request, version)
            elif (
                crash_item is not None and request.get("context", {}).get("item_key") == crash_item
            ):
                raise RuntimeError(f"crashed on {crash_item}")
            else:
                answer["result"] = await _call(handler, request)
        except InstantOutOfRangeError as exc:
            body = wire.encode_error(exc)
            if overflow == "internal":
                body = {"kind": "internal", "message": str(exc), "type": "OverflowException"}
            answer["error"] = body
        except DsmError as exc:
            answer["error"] = wire.encode_error(exc)
        except ValueError as exc:
            answer["error"] = {"kind": "bad_request", "message": str(exc)}
        except RuntimeError as exc:
            answer["error"] = {"kind": "internal", "message": str(exc), "type": "RuntimeError"}
        print(json.dumps(answer), flush=True)
        if request["op"] == "close":
            return


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
