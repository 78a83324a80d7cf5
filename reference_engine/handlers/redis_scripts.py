"""The Lua scripts behind :class:`~reference_engine.handlers.redis_handler.RedisStateHandler`.

One script per write operation, because a Redis script runs to completion
without any other client's command in between: the read of the current
record, the decision and the write are one atomic step, which is the whole of
what the handler Protocol asks of a store.

The scripts never read Redis' ``TIME``.  "Now" is the handler's injected
clock, passed as ``ARGV[1]`` in epoch microseconds, so a simulated clock jump
reaches the store exactly as it reaches the reference model.  Nor do they
encode the transition table: the caller passes, per call, the statuses from
which the requested transition is allowed (derived from
:data:`reference_engine.status.TRANSITIONS`), as a comma-framed list such as
``",none,failed,expired,"``.

Reply convention of the write scripts: a table whose first element is
``"ok"`` or a refusal code the handler turns into the reference model's
exception:

* ``{"stale", attempt_or_empty, status_or_none}`` -> ``StaleLockError``
* ``{"held", locked_until}`` -> ``LockHeldError``
* ``{"notheld"}`` -> ``LockNotHeldError``
* ``{"forbidden", source}`` -> ``ForbiddenTransitionError`` (source = effective status)
* ``{"busy"}`` -> ``try_acquire_lock`` returns ``None``

* ``{"lost", store_id_or_empty}`` -> ``StoreLostError`` (every script, sweeps included)

Every write script shares one ``ARGV`` layout (see :data:`COMMON_ARGS`) and
``KEYS[1..3]`` = record hash, lock index, retention index; operation-specific
arguments start at ``ARGV[11]``.

The sweeps read their index (``ZRANGEBYSCORE`` over the lock or retention
index), which every write script keeps in the same atomic step as the record.
An index can still lose an entry behind the handler's back: an operator's
``ZREM`` or ``DEL``, a partial restore, eviction under an ``allkeys-*``
memory policy.  A record whose lock entry is gone would stay Processing
forever.  So every sweep first **audits** a slice of the namespace: one
``SCAN`` step (``COUNT`` :data:`AUDIT_SLICE`, resuming from a cursor kept in
the namespace) re-indexes each record it meets from the record's own fields,
then the sweep reads the repaired index.  This was chosen because it costs
the hot path nothing (no write checks anything more) and each sweep a bounded
amount; the price is latency: a lost entry is repaired within one full pass
of the cursor, i.e. after about ``keys in the database / AUDIT_SLICE`` sweeps.
A second index, or a count checked by every write, would be lost the same
ways as the first, and would tax every write for a fault no write causes.

Every script's **last** key is the namespace's store identity marker and its
last argument the identity the handler read when it opened.  The check runs
before anything else, inside the same script, so a flushed or replaced store
costs no extra round trip to notice and is never written to: without it a
flushed Redis answers "no record" for finished work and every item is
charged again.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

__all__ = [
    "ACQUIRE",
    "AUDIT_SLICE",
    "BEGIN",
    "COMMON_ARGS",
    "EXPIRE_PAST_RETENTION",
    "RELEASE_AS_FAILED",
    "RESET_EXPIRED_LOCKS",
    "SET",
    "STORE_CLAIM",
    "UPSERT",
    "RegisteredScripts",
]

#: The ``COUNT`` of the ``SCAN`` step each sweep audits: hash-table buckets, not keys, so
#: a sweep's extra work stays bounded whatever the database holds.
AUDIT_SLICE = 1000

#: Names of ``ARGV[1..10]`` in every write script, in order.
COMMON_ARGS = (
    "now",
    "retain_until",
    "entity_execution_id",
    "source_app_id",
    "tenant_id",
    "scope_id",
    "entity_id",
    "item_entity_key",
    "item_key",
    "lock_token",
)

# Shared by every script.  Timestamps are epoch microseconds, written as decimal
# integers.  Past 2^53 (the year 2255) a double no longer holds every one of
# them, and instants run to year 9999: so the scripts compare them as the
# integers they are (``us_le``, ``us_lt``), never through Lua's numbers.  The
# sorted-set scores are doubles too: an index is read inclusively and every
# entry it returns is checked exactly.  Absent hash fields mean None (HMGET
# answers false for them).
_PRELUDE = """
local NOW_S = ARGV[1]

-- a <= b for two decimal integers (as Python writes them: no leading zeros).
local function us_le(a, b)
  local na, nb = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if na ~= nb then return na end
  if na then return us_le(string.sub(b, 2), string.sub(a, 2)) end
  if #a ~= #b then return #a < #b end
  return a <= b
end

local function us_lt(a, b)
  return a ~= b and us_le(a, b)
end

local function is_live(status, locked_until)
  return status == 'processing' and locked_until and us_le(NOW_S, locked_until)
end

local function effective(status, locked_until)
  if not status then return 'none' end
  if status == 'processing' and not is_live(status, locked_until) then return 'failed' end
  return status
end

local STORE_ID = redis.call('GET', KEYS[#KEYS])
if STORE_ID ~= ARGV[#ARGV] then return {'lost', STORE_ID or ''} end

local function contains(framed, value)
  return string.find(framed, ',' .. value .. ',', 1, true) ~= nil
end

local function reindex(key, locks, retention)
  local r = redis.call('HMGET', key, 'status', 'locked_until', 'retain_until')
  if r[1] == 'processing' and r[2] then
    redis.call('ZADD', locks, r[2], key)
  else
    redis.call('ZREM', locks, key)
  end
  if r[3] and r[1] and r[1] ~= 'expired' then
    redis.call('ZADD', retention, r[3], key)
  else
    redis.call('ZREM', retention, key)
  end
end
"""

# The sweeps' shared part: before reading an index, re-index one slice of the
# namespace's records from the records themselves (the audit described in the
# module docstring).  KEYS[1..3] = lock index, retention index, audit cursor;
# ARGV[2..5] = SCAN pattern, current-record prefix, history prefix, slice size.
_SWEEP_PRELUDE = (
    _PRELUDE
    + """
local LOCKS, RETENTION = KEYS[1], KEYS[2]

local function starts(text, prefix)
  return string.sub(text, 1, #prefix) == prefix
end

local function audit()
  local cursor = redis.call('GET', KEYS[3])
  if not cursor or not tonumber(cursor) then cursor = '0' end
  local reply = redis.call('SCAN', cursor, 'MATCH', ARGV[2], 'COUNT', ARGV[5])
  for _, key in ipairs(reply[2]) do
    if starts(key, ARGV[3]) or starts(key, ARGV[4]) then reindex(key, LOCKS, RETENTION) end
  end
  if reply[1] == '0' then redis.call('DEL', KEYS[3]) else redis.call('SET', KEYS[3], reply[1]) end
end

audit()
"""
)

# The write scripts' shared part: the record's key and stamp arguments, the
# read of the current record and the one write path (insert or update).
_WRITE_PRELUDE = (
    _PRELUDE
    + """
local REC, LOCKS, RETENTION = KEYS[1], KEYS[2], KEYS[3]
local RETAIN = ARGV[2]
local TOKEN = ARGV[10]

local function load()
  local r = redis.call('HMGET', REC, 'status', 'attempt', 'locked_until')
  return r[1], r[2], r[3]
end

local function not_holder(status, attempt)
  if status ~= 'processing' or tonumber(attempt) ~= tonumber(TOKEN) then
    return {'stale', attempt or '', status or 'none'}
  end
  return nil
end

-- changes: field -> string to set, or false to delete; a missing field is kept.
local function write(is_new, changes)
  if is_new then
    changes.created_at = NOW_S
    changes.tenant_id = ARGV[5]
    changes.scope_id = ARGV[6]
    changes.entity_id = ARGV[7]
    changes.item_entity_key = ARGV[8]
    changes.item_key = ARGV[9]
  end
  changes.entity_execution_id = ARGV[3]
  changes.source_app_id = ARGV[4]
  changes.updated_at = NOW_S
  if RETAIN ~= '' then changes.retain_until = RETAIN else changes.retain_until = false end
  local put, drop = {}, {}
  for field, value in pairs(changes) do
    if value == false then
      drop[#drop + 1] = field
    else
      put[#put + 1] = field
      put[#put + 1] = value
    end
  end
  redis.call('HSET', REC, unpack(put))
  -- A new record has nothing to drop: no record means no hash (HMGET read no status).
  if #drop > 0 and not is_new then redis.call('HDEL', REC, unpack(drop)) end
  if changes.status == nil or changes.locked_until == nil then
    reindex(REC, LOCKS, RETENTION)
    return
  end
  -- Every write sets status, locked_until and retain_until: index from them, no read back.
  if changes.status == 'processing' and changes.locked_until then
    redis.call('ZADD', LOCKS, changes.locked_until, REC)
  else
    redis.call('ZREM', LOCKS, REC)
  end
  if changes.retain_until and changes.status ~= 'expired' then
    redis.call('ZADD', RETENTION, changes.retain_until, REC)
  else
    redis.call('ZREM', RETENTION, REC)
  end
end
"""
)

#: ARGV[11] = locked_until, ARGV[12] = statuses the lock may be taken over from
#: (ACQUIRABLE), ARGV[13] = statuses Processing may follow.
ACQUIRE = (
    _WRITE_PRELUDE
    + """
local status, attempt, locked_until = load()
local source = effective(status, locked_until)
if not contains(ARGV[12], source) then return {'busy'} end
if not contains(ARGV[13], source) then return {'forbidden', source} end
local token = 1
if status then token = tonumber(attempt) + 1 end
write(not status, {
  status = 'processing', attempt = tostring(token), locked_until = ARGV[11], error_detail = false
})
return {'ok', token}
"""
)

#: ``begin``: ACQUIRE's arguments, plus ARGV[14] = the completed statuses (COMPLETED).
#: Replies ``{'done', HGETALL of the record}`` when the item is completed, ``{'busy',
#: locked_until}`` under a live lock, else exactly what ACQUIRE replies: the
#: question "is it done?" and the acquire in one script, one round trip.
BEGIN = (
    _WRITE_PRELUDE
    + """
local status, attempt, locked_until = load()
local source = effective(status, locked_until)
if contains(ARGV[14], source) then return {'done', redis.call('HGETALL', REC)} end
if not contains(ARGV[12], source) then return {'busy', locked_until or ''} end
if not contains(ARGV[13], source) then return {'forbidden', source} end
local token = 1
if status then token = tonumber(attempt) + 1 end
write(not status, {
  status = 'processing', attempt = tostring(token), locked_until = ARGV[11], error_detail = false
})
return {'ok', token}
"""
)

#: ARGV[11] = target status, ARGV[12] = data, ARGV[13] = '1' if data is given,
#: ARGV[14] = statuses the target may follow, ARGV[15] = '1' if only the holder may write it.
SET = (
    _WRITE_PRELUDE
    + """
local status, attempt, locked_until = load()
local changes = {status = ARGV[11], locked_until = false}
if ARGV[13] == '1' then changes.data = ARGV[12] end
if TOKEN ~= '' then
  local refusal = not_holder(status, attempt)
  if refusal then return refusal end
  if not contains(ARGV[14], 'processing') then return {'forbidden', 'processing'} end
  write(false, changes)
  return {'ok'}
end
if is_live(status, locked_until) then return {'held', locked_until} end
if ARGV[15] == '1' then return {'notheld'} end
local source = effective(status, locked_until)
if not contains(ARGV[14], source) then return {'forbidden', source} end
if not status then changes.attempt = '0' end
write(not status, changes)
return {'ok'}
"""
)

#: ARGV[11] = error detail, ARGV[12] = statuses Failed may follow.
RELEASE_AS_FAILED = (
    _WRITE_PRELUDE
    + """
local status, attempt, locked_until = load()
local refusal = not_holder(status, attempt)
if refusal then return refusal end
if not contains(ARGV[12], 'processing') then return {'forbidden', 'processing'} end
write(false, {status = 'failed', locked_until = false, error_detail = ARGV[11]})
return {'ok'}
"""
)

#: KEYS[4] = history sequence, KEYS[5] = set of history hashes.
#: ARGV[11] = data, ARGV[12] = '1' if data is given, ARGV[13] = statuses upsert
#: acquires-and-completes from (ACQUIRABLE), ARGV[14] = those of them whose path
#: to Processed the table allows, ARGV[15] = statuses Superseded may follow,
#: ARGV[16] = prefix of history hash keys.
UPSERT = (
    _WRITE_PRELUDE
    + """
local status, attempt, locked_until = load()
local changes = {status = 'processed', locked_until = false}
if ARGV[12] == '1' then changes.data = ARGV[11] end
if TOKEN ~= '' then
  local refusal = not_holder(status, attempt)
  if refusal then return refusal end
  if not contains(ARGV[14], 'processing') then return {'forbidden', 'processing'} end
  write(false, changes)
  return {'ok'}
end
if is_live(status, locked_until) then return {'held', locked_until} end
local source = effective(status, locked_until)
if contains(ARGV[13], source) then
  if not contains(ARGV[14], source) then return {'forbidden', source} end
  changes.error_detail = false
  if status then changes.attempt = tostring(tonumber(attempt) + 1) else changes.attempt = '1' end
  write(not status, changes)
  return {'ok'}
end
if not contains(ARGV[15], source) then return {'forbidden', source} end
local history = ARGV[16] .. redis.call('INCR', KEYS[4])
redis.call('RENAME', REC, history)
redis.call('HSET', history, 'status', 'superseded', 'updated_at', NOW_S)
redis.call('ZREM', LOCKS, REC)
redis.call('ZREM', RETENTION, REC)
reindex(history, LOCKS, RETENTION)
redis.call('SADD', KEYS[5], history)
changes.attempt = attempt
write(true, changes)
return {'ok'}
"""
)

#: The sweeps' keys and arguments (see ``_SWEEP_PRELUDE``), then KEYS[4] = marker;
#: ARGV[6] = error detail the sweep writes, ARGV[7] = store identity.
RESET_EXPIRED_LOCKS = (
    _SWEEP_PRELUDE
    + """
local count = 0
for _, key in ipairs(redis.call('ZRANGEBYSCORE', LOCKS, '-inf', NOW_S)) do
  local r = redis.call('HMGET', key, 'status', 'locked_until')
  if r[1] == 'processing' and r[2] and us_lt(r[2], NOW_S) then
    redis.call('HSET', key, 'status', 'failed', 'error_detail', ARGV[6], 'updated_at', NOW_S)
    redis.call('HDEL', key, 'locked_until')
    count = count + 1
  end
  if not is_live(r[1], r[2]) then redis.call('ZREM', LOCKS, key) end
end
return count
"""
)

#: The sweeps' keys and arguments (see ``_SWEEP_PRELUDE``), then KEYS[4] = marker;
#: ARGV[6] = store identity.
EXPIRE_PAST_RETENTION = (
    _SWEEP_PRELUDE
    + """
local count = 0
for _, key in ipairs(redis.call('ZRANGEBYSCORE', RETENTION, '-inf', NOW_S)) do
  local r = redis.call('HMGET', key, 'status', 'locked_until', 'retain_until')
  if not r[1] or r[1] == 'expired' or not r[3] then
    redis.call('ZREM', RETENTION, key)
  elseif not is_live(r[1], r[2]) and us_lt(r[3], NOW_S) then
    redis.call('HSET', key, 'status', 'expired', 'updated_at', NOW_S)
    redis.call('HDEL', key, 'locked_until')
    redis.call('ZREM', RETENTION, key)
    redis.call('ZREM', LOCKS, key)
    count = count + 1
  end
end
return count
"""
)


#: Run by ``open``: KEYS[1] = marker, ARGV[1] = a fresh identity, ARGV[2] = the identity
#: this handler saw before ('' the first time).  A namespace without a marker gets the
#: fresh one, unless the handler had seen one already (then it was lost); otherwise
#: the stored identity is adopted, so every handler of one namespace shares it.
STORE_CLAIM = """
local current = redis.call('GET', KEYS[1])
if not current then
  if ARGV[2] ~= '' then return {'lost', ''} end
  redis.call('SET', KEYS[1], ARGV[1])
  return {'ok', ARGV[1]}
end
if ARGV[2] ~= '' and current ~= ARGV[2] then return {'lost', current} end
return {'ok', current}
"""


@dataclass(frozen=True, slots=True)
class RegisteredScripts:
    """The scripts bound to one client; each call is one ``EVALSHA`` (reloaded on ``NOSCRIPT``)."""

    acquire: AsyncScript
    set: AsyncScript
    release_as_failed: AsyncScript
    upsert: AsyncScript
    reset_expired_locks: AsyncScript
    expire_past_retention: AsyncScript
    store_claim: AsyncScript
    begin: AsyncScript

    @classmethod
    def register(cls, client: Redis) -> RegisteredScripts:
        return cls(
            acquire=client.register_script(ACQUIRE),
            set=client.register_script(SET),
            release_as_failed=client.register_script(RELEASE_AS_FAILED),
            upsert=client.register_script(UPSERT),
            reset_expired_locks=client.register_script(RESET_EXPIRED_LOCKS),
            expire_past_retention=client.register_script(EXPIRE_PAST_RETENTION),
            store_claim=client.register_script(STORE_CLAIM),
            begin=client.register_script(BEGIN),
        )
