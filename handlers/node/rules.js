// The rules both Node handlers share: the protocol's constants, the transition table of
// reference_engine/status.py, time as integer microseconds, and the checks every handler makes
// the same way (reference_engine/model.py). Plain Node.js, no packages.

"use strict";

// The protocol version these handlers speak (docs/protocol.md, Versions): 2, whose error
// kinds include instant_out_of_range.
const PROTOCOL_VERSION = 2;
const MAX_DATA_BYTES = 256 * 1024;
const SWEEP_ERROR_DETAIL = "lock expired; reset by the catch-up sweep";

// The transition table of reference_engine/status.py.
const TRANSITIONS = {
  none: ["processing", "skipped"],
  processing: ["processed", "failed", "skipped", "expired"],
  processed: ["superseded", "skipped", "expired"],
  failed: ["processing", "skipped", "expired"],
  superseded: ["skipped", "expired"],
  skipped: ["skipped", "expired"],
  expired: ["processing", "skipped"],
};

const ACQUIRABLE = new Set(["none", "failed", "expired"]);

const SETTABLE = new Set(["processed", "failed", "skipped", "expired"]);

const NEEDS_LOCK = new Set(["processed", "failed"]);

const label = (status) => status.charAt(0).toUpperCase() + status.slice(1);

const INSTANT = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?Z$/;

// BigInt microseconds: past 2255 an instant in microseconds passes 2**53, where a Number
// starts to drop the last microsecond (the kit keeps records for up to a century past
// instants that far out).
function parseInstant(text) {
  const m = INSTANT.exec(text);
  if (!m) throw new Refusal("bad_request", `not an instant: ${JSON.stringify(text)}`);
  // Date.UTC reads years 0-99 as 1900-1999: set the year apart (2000 is a leap year too).
  const day = new Date(Date.UTC(2000, +m[2] - 1, +m[3], +m[4], +m[5], +m[6]));
  const ms = day.setUTCFullYear(+m[1]);
  const micros = m[7] ? BigInt((m[7] + "000000").slice(0, 6)) : 0n;
  return BigInt(ms) * 1000n + micros;
}

function formatInstant(us) {
  if (us === null) return null;
  let ms = us / 1000n;
  let rest = us % 1000n;
  if (rest < 0n) {
    rest += 1000n;
    ms -= 1n;
  }
  return new Date(Number(ms)).toISOString().slice(0, 23) + String(rest).padStart(3, "0") + "Z";
}

// The last instant a record can hold, 9999-12-31T23:59:59.999999Z, in microseconds: Python's
// datetime and the stores' timestamp types end there (reference_engine/config.py).
const LAST_INSTANT = 253402300799999999n;

// A duration of the request (lock_duration_us, retention_us) added to an instant; past the
// last instant it is the protocol's instant_out_of_range, and nothing is written.
function after(instant, durationUs, option) {
  const end = instant + BigInt(durationUs);
  if (end > LAST_INSTANT) {
    const now = formatInstant(instant);
    const duration = `${durationUs} microseconds`;
    throw new Refusal(
      "instant_out_of_range",
      `invalid DataStateMachine option '${option}': now (${now}) + ${option} (${duration}) is past ` +
        `9999-12-31 23:59:59.999999 UTC, the last instant a record can hold; nothing was written`,
      { option, now, duration },
    );
  }
  return end;
}

// Until when a record written at `now` is kept: null keeps it forever.
const retainUntil = (ctx, now) => (ctx.retention_us === null ? null : after(now, ctx.retention_us, "retention"));

// When a lock taken at `now` expires.
const lockedUntil = (ctx, now) => after(now, ctx.lock_duration_us, "lockDuration");

function isLive(record, now) {
  return record.status === "processing" && record.locked_until !== null && now <= record.locked_until;
}

function effectiveStatus(record, now) {
  if (!record) return "none";
  if (record.status === "processing" && !isLive(record, now)) return "failed";
  return record.status;
}

function checkTransition(source, target, ctx) {
  if (!TRANSITIONS[source].includes(target)) {
    const allowed = TRANSITIONS[source].map(label).sort();
    throw new Refusal(
      "forbidden_transition",
      `transition ${label(source)} -> ${label(target)} is not allowed for item ${JSON.stringify(ctx.item_key)}; allowed from ${label(source)}: ${allowed.join(", ")}`,
      { source: label(source), target: label(target), allowed, item_key: ctx.item_key },
    );
  }
}

// set() writes the statuses a node may choose; Processing and Superseded have their own calls.
function checkSettable(status) {
  if (SETTABLE.has(status)) return;
  const use = status === "superseded" ? "upsert()" : "try_acquire_lock()";
  throw new Refusal("unsupported_status", `set() cannot write status ${label(status)}; use ${use} instead`, {
    status: label(status),
    use,
  });
}

function checkData(dataJson) {
  if (dataJson === null) return;
  const size = Buffer.byteLength(dataJson, "utf8");
  if (size > MAX_DATA_BYTES) {
    throw new Refusal(
      "payload_too_large",
      `data payload is ${size} bytes serialised; the limit is ${MAX_DATA_BYTES} bytes`,
      { size, limit: MAX_DATA_BYTES },
    );
  }
}

// A retried fenced write whose first copy landed: the record shows exactly what the write
// asks for under its token (this status, unlocked, this error detail, this data or none
// given), so the retry succeeds and changes nothing (reference_engine/model.py,
// write_landed). Both texts are the harness's canonical JSON, so comparing them is exact.
function writeLanded(record, token, status, dataJson, errorDetail) {
  if (!record || record.attempt !== token || record.status !== status || record.locked_until !== null) return false;
  if (record.error_detail !== errorDetail) return false;
  return dataJson === null || record.data_json === dataJson;
}

function wireRecord(record) {
  return {
    key: record.key,
    status: record.status,
    attempt: record.attempt,
    locked_until: formatInstant(record.locked_until),
    data_json: record.data_json,
    error_detail: record.error_detail,
    entity_execution_id: record.entity_execution_id,
    source_app_id: record.source_app_id,
    created_at: formatInstant(record.created_at),
    updated_at: formatInstant(record.updated_at),
    retain_until: formatInstant(record.retain_until),
  };
}

class Refusal extends Error {
  constructor(kind, message, fields) {
    super(message);
    this.body = Object.assign({ kind, message }, fields || {});
  }
}

// The version open is answered with: PROTOCOL_VERSION when the harness offers it (in
// `protocols`, or in `protocol` alone from a harness that offers one version); a bad request
// naming what was offered otherwise.
function negotiate(req) {
  const offered = Array.isArray(req.protocols) ? req.protocols : [req.protocol];
  if (!offered.includes(PROTOCOL_VERSION)) {
    throw new Refusal(
      "bad_request",
      `this handler speaks protocol version ${PROTOCOL_VERSION}; open offered ${offered.join(", ")}`,
    );
  }
  return PROTOCOL_VERSION;
}

function recordKey(ctx) {
  return {
    tenant_id: ctx.tenant_id,
    scope_id: ctx.scope_id,
    entity_id: ctx.entity_id,
    item_entity_key: ctx.item_entity_key,
    item_key: ctx.item_key,
  };
}

function keyText(ctx) {
  // JSON of the parts: no separator can make two different keys collide.
  return JSON.stringify([ctx.tenant_id, ctx.scope_id, ctx.entity_id, ctx.item_entity_key, ctx.item_key]);
}

// Insert or update the current record of an in-memory store (a Map by keyText); a data of null keeps the stored data,
// an error_detail left undefined keeps the stored one.
function writeRecord(current, ctx, now, record, change) {
  if (!record) {
    current.set(keyText(ctx), {
      key: recordKey(ctx),
      status: change.status,
      attempt: change.attempt || 0,
      locked_until: change.locked_until,
      data_json: change.data_json === undefined ? null : change.data_json,
      error_detail: typeof change.error_detail === "string" ? change.error_detail : null,
      entity_execution_id: ctx.entity_execution_id,
      source_app_id: ctx.source_app_id,
      created_at: now,
      updated_at: now,
      retain_until: retainUntil(ctx, now),
    });
    return;
  }
  record.status = change.status;
  record.locked_until = change.locked_until;
  if (change.attempt !== undefined) record.attempt = change.attempt;
  if (change.data_json !== undefined && change.data_json !== null) record.data_json = change.data_json;
  if (change.error_detail !== undefined) record.error_detail = change.error_detail;
  record.entity_execution_id = ctx.entity_execution_id;
  record.source_app_id = ctx.source_app_id;
  record.updated_at = now;
  record.retain_until = retainUntil(ctx, now);
}

module.exports = {
  keyText,
  recordKey,
  writeRecord,
  PROTOCOL_VERSION,
  negotiate,
  SWEEP_ERROR_DETAIL,
  TRANSITIONS,
  ACQUIRABLE,
  SETTABLE,
  NEEDS_LOCK,
  label,
  parseInstant,
  formatInstant,
  after,
  retainUntil,
  lockedUntil,
  isLive,
  effectiveStatus,
  checkTransition,
  checkData,
  checkSettable,
  writeLanded,
  wireRecord,
  Refusal,
};
