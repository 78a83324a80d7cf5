// Steps of a counterexample, run against a handler in a team's own tests: each call is made
// through the contract at an instant of a ManualClock, and its answer is given back as the
// protocol's value (a record as `get` answers it, a token, a count, null), or { error: KIND }
// for a refusal, so a test compares it with what the kit's reference model answered.
// dsm verify prints a failing run of a Node handler as a node:test file written with these
// steps. Needs no package and no test framework.
//
//   const clock = new ManualClock();
//   const steps = new ProtocolSteps(new MyHandler(clock), clock);              // the contract
//   const steps = new ProtocolSteps(new MySeedHandler(clock), clock, { shape: "seed" });
//   steps.at("2026-03-02T09:00:00.000000Z");
//   assert.deepEqual(await steps.tryAcquireLock(ctx), 1);

"use strict";

const { perform, errorBody } = require("./host.js");
const { parseInstant, formatInstant } = require("./rules.js");
const { SeedHandlerAdapter } = require("./seed.js");

const SHAPES = ["contract", "seed"];

/** A clock the test moves: now() is BigInt microseconds, as the host's clock gives it. */
class ManualClock {
  constructor(now = "2000-01-01T00:00:00.000000Z") {
    this.instant = parseInstant(now);
  }

  now() {
    return this.instant;
  }

  /** Move to `now`, the protocol's instant text. */
  set(now) {
    this.instant = parseInstant(now);
  }

  toString() {
    return formatInstant(this.instant);
  }
}

class ProtocolSteps {
  /**
   * `handler`: a handler of the contract (host.js), or of the seed's interface with
   * { shape: "seed" } (adapted as the host adapts it, so the kit's tokens never reach it).
   */
  constructor(handler, clock, { shape = "contract" } = {}) {
    if (!handler) throw new TypeError("ProtocolSteps needs a handler");
    if (!(clock instanceof ManualClock)) throw new TypeError("ProtocolSteps needs the ManualClock the handler reads");
    if (!SHAPES.includes(shape)) throw new RangeError(`shape ${JSON.stringify(shape)}: one of ${SHAPES.join(", ")}`);
    this.handler = shape === "seed" ? new SeedHandlerAdapter(handler) : handler;
    this.clock = clock;
  }

  /** Move the clock to `now` (the protocol's instant text); the next call is made there. */
  at(now) {
    this.clock.set(now);
    return this;
  }

  async open() {
    if (typeof this.handler.open === "function") await this.handler.open();
  }

  async close(dropStore = true) {
    if (typeof this.handler.close === "function") await this.handler.close(dropStore);
  }

  exists(context) {
    return this.call("exists", { context });
  }

  get(context) {
    return this.call("get", { context });
  }

  tryAcquireLock(context) {
    return this.call("try_acquire_lock", { context });
  }

  /** `status` as the protocol spells it (processed, skipped...); `dataJson` the payload's text. */
  set(context, status, dataJson) {
    return this.call("set", { context, status, data_json: dataJson });
  }

  releaseLockAsFailed(context, errorDetail) {
    return this.call("release_lock_as_failed", { context, error_detail: errorDetail });
  }

  upsert(context, dataJson) {
    return this.call("upsert", { context, data_json: dataJson });
  }

  resetExpiredLocks() {
    return this.call("reset_expired_locks", {});
  }

  expirePastRetention() {
    return this.call("expire_past_retention", {});
  }

  /** The call's answer: its result as the protocol's value, or { error: KIND }; never throws. */
  call(op, request) {
    return perform(this.handler, op, request, this.clock.now()).then(
      (result) => result,
      (err) => ({ error: errorBody(err).kind }),
    );
  }
}

module.exports = { ManualClock, ProtocolSteps, SHAPES };
