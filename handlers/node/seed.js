// The seed's handler interface in JavaScript, and the host's adapter for it.
//
// A handler of the seed's interface has the contract's methods (host.js) with two
// differences: tryAcquireLock(ctx) answers whether the lock was taken (a boolean), and
// set(ctx, status, dataJson), releaseLockAsFailed(ctx, errorDetail) and upsert(ctx, dataJson)
// carry no token: ctx.lock_token is always null. Nothing tells such a handler which
// acquisition a write belongs to, so a holder whose lock was swept or taken over can still
// write when it wakes: the hazard stale_holder_late_write that dsm verify reports for it.
//
// SeedHandlerAdapter is the contract on the outside and the seed's calls on the inside, as
// the C# host's Protocol/SeedHandlerAdapter.cs: nothing is decided here. The kit's tokens
// never reach the seed handler, and the token answered for an acquisition is the attempt of
// the record the handler wrote, read back with get(), so the kit can tell holders apart in
// its story (the grants counted here when the handler keeps no attempt). Nothing is fenced
// by it: a stale holder's late write reaches the handler as any other write does. The read-back
// is a second call: a write another request lands between the two is what it reads.

"use strict";

// The parts of a context that name its item: the record's key.
function keyText(ctx) {
  return JSON.stringify([ctx.tenant_id, ctx.scope_id, ctx.entity_id, ctx.item_entity_key, ctx.item_key]);
}

// The context without the kit's token: what the seed's interface has no parameter for.
function tokenless(ctx) {
  return ctx.lock_token === null ? ctx : Object.freeze({ ...ctx, lock_token: null });
}

class SeedHandlerAdapter {
  constructor(seed) {
    this.seed = seed;
    this.granted = new Map(); // item -> the last token answered for it
  }

  exists(ctx) {
    return this.seed.exists(tokenless(ctx));
  }

  get(ctx) {
    return this.seed.get(tokenless(ctx));
  }

  async tryAcquireLock(ctx) {
    const plain = tokenless(ctx);
    if (!(await this.seed.tryAcquireLock(plain))) return null;
    const record = await this.seed.get(plain);
    const key = keyText(ctx);
    const last = this.granted.get(key) || 0;
    // The record's attempt when the handler keeps one; else the grants counted here.
    const attempt = record ? Number(record.attempt) : 0;
    const token = attempt > last ? attempt : last + 1;
    this.granted.set(key, token);
    return token;
  }

  set(ctx, status, dataJson) {
    return this.seed.set(tokenless(ctx), status, dataJson);
  }

  releaseLockAsFailed(ctx, errorDetail) {
    return this.seed.releaseLockAsFailed(tokenless(ctx), errorDetail);
  }

  upsert(ctx, dataJson) {
    return this.seed.upsert(tokenless(ctx), dataJson);
  }

  resetExpiredLocks() {
    return this.seed.resetExpiredLocks();
  }

  expirePastRetention() {
    return this.seed.expirePastRetention();
  }

  open() {
    return typeof this.seed.open === "function" ? this.seed.open() : undefined;
  }

  close(dropStore) {
    return typeof this.seed.close === "function" ? this.seed.close(dropStore) : undefined;
  }
}

module.exports = { SeedHandlerAdapter, tokenless };
