#!/usr/bin/env node
// An in-memory handler written to the seed's interface as it is (seed.js): tryAcquireLock
// answers true or false, and set, releaseLockAsFailed and upsert carry no token. It keeps
// every promise of the seed with the rules of memory.js: a write on a Processing record is
// taken as the holder's, which is all a handler of this interface can do (the seed's flow
// writes there only after acquiring). What it cannot do is tell a holder whose lock was swept
// or taken over from the one that holds the item now.
//
// It contains no protocol code: host.js serves it unchanged, and says "shape": "seed".
//
//   dsm verify --exec "node handlers/node/seed-memory.js" --profile dev
//   DSM_NODE_BUG=check_then_insert node handlers/node/seed-memory.js   (a deliberately racy acquire)
//
// check_then_insert: acquire reads the record, awaits a round trip to the store, then writes
// the lock with no condition, so two workers racing for one item can both be told true.

"use strict";

const {
  SWEEP_ERROR_DETAIL,
  ACQUIRABLE,
  NEEDS_LOCK,
  label,
  retainUntil,
  lockedUntil,
  isLive,
  effectiveStatus,
  checkTransition,
  checkData,
  checkSettable,
  Refusal,
  keyText,
  writeRecord,
} = require("./rules.js");

const BUGS = ["", "check_then_insert"];
const COMPLETED = new Set(["processed", "skipped"]);

// A store round trip: the moment another request can run in between.
const roundTrip = () => new Promise((resolve) => setTimeout(resolve, 5));

class SeedMemoryHandler {
  /** `clock.now()`: BigInt microseconds. `bug`: one of BUGS ("" for none). */
  constructor(clock, bug = "") {
    if (!BUGS.includes(bug)) throw new Error(`unknown bug ${JSON.stringify(bug)}; known: ${BUGS.join(", ")}`);
    this.clock = clock;
    this.bug = bug;
    this.current = new Map();
    this.superseded = [];
  }

  async exists(ctx) {
    return COMPLETED.has(effectiveStatus(this.current.get(keyText(ctx)), this.clock.now()));
  }

  async get(ctx) {
    const record = this.current.get(keyText(ctx));
    return record ? { ...record } : null;
  }

  async tryAcquireLock(ctx) {
    const now = this.clock.now();
    const until = lockedUntil(ctx, now);
    retainUntil(ctx, now);
    let record = this.current.get(keyText(ctx));
    const source = effectiveStatus(record, now);
    if (!ACQUIRABLE.has(source)) return false;
    checkTransition(source, "processing", ctx);
    if (this.bug === "check_then_insert") {
      const attempt = record ? record.attempt + 1 : 1;
      await roundTrip();
      record = this.current.get(keyText(ctx));
      this.write(ctx, now, record, { status: "processing", attempt, locked_until: until, error_detail: null });
      return true;
    }
    this.write(ctx, now, record, {
      status: "processing",
      attempt: record ? record.attempt + 1 : 1,
      locked_until: until,
      error_detail: null,
    });
    return true;
  }

  async set(ctx, status, dataJson) {
    const now = this.clock.now();
    checkSettable(status);
    checkData(dataJson);
    retainUntil(ctx, now);
    const record = this.current.get(keyText(ctx));
    if (record && record.status === "processing") {
      // The holder's write: the only reading a store without tokens has.
      checkTransition("processing", status, ctx);
      this.write(ctx, now, record, { status, data_json: dataJson, locked_until: null });
      return;
    }
    if (NEEDS_LOCK.has(status)) throw this.lockNotHeld(ctx, `set(${label(status)})`);
    checkTransition(effectiveStatus(record, now), status, ctx);
    this.write(ctx, now, record, {
      status,
      data_json: dataJson,
      locked_until: null,
      attempt: record ? record.attempt : 0,
    });
  }

  async releaseLockAsFailed(ctx, errorDetail) {
    const now = this.clock.now();
    retainUntil(ctx, now);
    const record = this.current.get(keyText(ctx));
    if (!record || record.status !== "processing") throw this.lockNotHeld(ctx, "release_lock_as_failed");
    this.write(ctx, now, record, { status: "failed", locked_until: null, error_detail: errorDetail });
  }

  async upsert(ctx, dataJson) {
    const now = this.clock.now();
    checkData(dataJson);
    retainUntil(ctx, now);
    const key = keyText(ctx);
    const record = this.current.get(key);
    if (record && record.status === "processing") {
      this.write(ctx, now, record, { status: "processed", data_json: dataJson, locked_until: null });
      return;
    }
    const source = effectiveStatus(record, now);
    if (ACQUIRABLE.has(source)) {
      // The happy path compressed: acquire and complete in one step.
      this.write(ctx, now, record, {
        status: "processed",
        data_json: dataJson,
        locked_until: null,
        attempt: record ? record.attempt + 1 : 1,
        error_detail: null,
      });
      return;
    }
    checkTransition(source, "superseded", ctx);
    record.status = "superseded";
    record.updated_at = now;
    this.superseded.push(record);
    this.current.delete(key);
    this.write(ctx, now, undefined, {
      status: "processed",
      data_json: dataJson,
      locked_until: null,
      attempt: record.attempt,
    });
  }

  async resetExpiredLocks() {
    const now = this.clock.now();
    let count = 0;
    for (const record of this.current.values()) {
      if (record.status === "processing" && record.locked_until !== null && record.locked_until < now) {
        record.status = "failed";
        record.locked_until = null;
        record.error_detail = SWEEP_ERROR_DETAIL;
        record.updated_at = now;
        count += 1;
      }
    }
    return count;
  }

  async expirePastRetention() {
    const now = this.clock.now();
    let count = 0;
    for (const record of [...this.current.values(), ...this.superseded]) {
      if (record.retain_until !== null && record.retain_until < now && record.status !== "expired" && !isLive(record, now)) {
        record.status = "expired";
        record.locked_until = null;
        record.updated_at = now;
        count += 1;
      }
    }
    return count;
  }

  lockNotHeld(ctx, operation) {
    return new Refusal(
      "lock_not_held",
      `${operation} on item ${JSON.stringify(ctx.item_key)} needs the processing lock; call tryAcquireLock first`,
      { item_key: ctx.item_key, operation },
    );
  }

  // Insert or update the current record; a data of null keeps the stored data, an
  // error_detail left undefined keeps the stored one.
  write(ctx, now, record, change) {
    writeRecord(this.current, ctx, now, record, change);
  }
}

module.exports = { SeedMemoryHandler, BUGS };

if (require.main === module) {
  const bug = process.env.DSM_NODE_BUG || "";
  if (!BUGS.includes(bug)) {
    process.stderr.write(`seed-memory.js: unknown DSM_NODE_BUG=${bug}; known: ${BUGS.filter(Boolean).join(", ")}\n`);
    process.exit(2);
  }
  const { serveSeed } = require("./host.js");
  const name = "node seed-interface in-memory" + (bug ? ` (bug: ${bug})` : "");
  serveSeed((clock) => new SeedMemoryHandler(clock, bug), { name });
}
