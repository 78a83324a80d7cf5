// The protocol host for a DataStateMachine handler written in JavaScript: it speaks the dsm
// handler protocol (docs/protocol.md) on stdin and stdout and calls the handler object a
// factory builds, so a team's handler needs no protocol code of its own:
//
//   const { serve } = require("dsm-node-handlers/host.js");
//   serve((clock) => new MyHandler(clock));            // the contract (fencing tokens)
//   serveSeed((clock) => new MySeedHandler(clock));    // the seed's interface, unchanged
//
// The contract a handler implements (every method may return a value or a Promise of it):
//
//   exists(ctx) -> boolean                 get(ctx) -> record or null
//   tryAcquireLock(ctx) -> token or null   set(ctx, status, dataJson)
//   releaseLockAsFailed(ctx, errorDetail)  upsert(ctx, dataJson)
//   resetExpiredLocks() -> count           expirePastRetention() -> count
//   open() and close(dropStore), both optional
//
// A factory `(clock, storeName) => ...` is given the store the harness names on open (and
// answers "named_store": true): the kit then races peers, more processes on that store. Each
// open must start from an empty store.
//
// `ctx` is the request's context as the protocol spells it (tenant_id, item_key,
// lock_duration_us, retention_us, lock_token...), frozen. A record is the protocol's record
// with its instants as BigInt microseconds (rules.js, wireRecord). A refusal is a
// rules.Refusal (its kind is the protocol's error kind); anything else thrown is `internal`.
// Time comes from the clock the factory is given: clock.now() is the `now` of the request
// being served, as BigInt microseconds, carried through every await of that request.
//
// A handler of the seed's interface (seed.js) runs through serveSeed: the host adapts it and
// answers `open` with "shape": "seed", so dsm verify judges it under the seed profile.

"use strict";

const { AsyncLocalStorage } = require("node:async_hooks");
const { negotiate, parseInstant, wireRecord, Refusal } = require("./rules.js");

const LANGUAGE = "node";

// The instant of the request being served, for every await that request makes.
const served = new AsyncLocalStorage();

/** The clock a handler reads: the `now` of the request it is serving. */
const requestClock = Object.freeze({
  now() {
    const now = served.getStore();
    if (now === undefined) throw new Error("clock.now() read outside a request: read it inside a handler call");
    return now;
  },
});

// A token as the protocol answers it: an integer, or null when the lock was not acquired.
function wireToken(token) {
  if (token === null || token === undefined) return null;
  if (typeof token === "bigint") return Number(token);
  return token;
}

// The protocol operation -> the handler call and how its answer goes on the wire.
const OPERATIONS = {
  exists: (h, req) => Promise.resolve(h.exists(req.context)).then(Boolean),
  get: (h, req) => Promise.resolve(h.get(req.context)).then((r) => (r ? wireRecord(r) : null)),
  try_acquire_lock: (h, req) => Promise.resolve(h.tryAcquireLock(req.context)).then(wireToken),
  set: (h, req) => Promise.resolve(h.set(req.context, req.status, req.data_json)).then(() => null),
  release_lock_as_failed: (h, req) =>
    Promise.resolve(h.releaseLockAsFailed(req.context, req.error_detail)).then(() => null),
  upsert: (h, req) => Promise.resolve(h.upsert(req.context, req.data_json)).then(() => null),
  reset_expired_locks: (h) => Promise.resolve(h.resetExpiredLocks()).then(Number),
  expire_past_retention: (h) => Promise.resolve(h.expirePastRetention()).then(Number),
};

/**
 * Call one operation on `handler` at instant `now` (BigInt microseconds); its answer as the
 * protocol's result value. Shared by the host and by ProtocolSteps (steps.js).
 */
function perform(handler, op, req, now) {
  const operation = Object.prototype.hasOwnProperty.call(OPERATIONS, op) ? OPERATIONS[op] : null;
  if (!operation) return Promise.reject(new Refusal("bad_request", `unknown op ${JSON.stringify(op)}`));
  const frozen = req.context ? Object.freeze({ ...req.context }) : undefined;
  return served.run(now, () => {
    try {
      return operation(handler, { ...req, context: frozen });
    } catch (err) {
      return Promise.reject(err); // thrown before a Promise was returned: answered the same way
    }
  });
}

/** An error as the protocol answers it: a Refusal by its kind, anything else `internal`. */
function errorBody(err) {
  if (err instanceof Refusal) return err.body;
  return { kind: "internal", message: String(err && (err.stack || err)), type: String(err && err.name) };
}

// One session on stdin: the factory builds the handler on open, close ends it.
function session(factory, options, send) {
  let handler = null;
  const inFlight = new Set();
  const state = { closed: false };

  const answer = (message) => send(JSON.stringify(message) + "\n");

  async function open(req, now) {
    const protocol = negotiate(req);
    // A factory of two parameters works in the store the harness names: every process opened
    // with that name must reach the same records, and the close that says drop_store removes it.
    const named = typeof req.store === "string" && factory.length >= 2;
    const made = factory(requestClock, named ? req.store : null);
    handler = options.adapt ? options.adapt(made) : made;
    if (typeof handler.open === "function") await served.run(now, () => handler.open());
    return {
      protocol,
      concurrent: true,
      name: options.name || "node handler",
      shared_store: false,
      named_store: named,
      shape: options.shape,
      language: LANGUAGE,
    };
  }

  async function close(req, now) {
    await Promise.allSettled([...inFlight]);
    if (handler && typeof handler.close === "function") {
      await served.run(now, () => handler.close(req.drop_store === true));
    }
    return null;
  }

  // open and close run alone, in order: each waits for the one before it.
  let ordered = Promise.resolve();

  function receive(line) {
    let req;
    try {
      req = JSON.parse(line);
    } catch (err) {
      process.stderr.write(`host.js: a request is not JSON (${err.message}); ignored\n`);
      return;
    }
    const id = req && req.id;
    const reply = (result) => answer({ id, result: result === undefined ? null : result });
    const refuse = (err) => answer({ id, error: errorBody(err) });
    let now;
    try {
      now = parseInstant(req.now);
    } catch (err) {
      refuse(err);
      return;
    }
    if (req.op === "open" || req.op === "close") {
      if (req.op === "close") state.closed = true;
      const step = req.op === "open" ? () => open(req, now) : () => close(req, now);
      ordered = ordered.then(step).then(reply, refuse);
      return;
    }
    const call = ordered.then(() => {
      if (!handler) throw new Refusal("bad_request", `${JSON.stringify(req.op)} before open`);
      return perform(handler, req.op, req, now);
    });
    const answered = call.then(reply, refuse);
    inFlight.add(answered);
    answered.finally(() => inFlight.delete(answered));
  }

  state.receive = receive;
  return state;
}

function run(factory, options) {
  const state = session(factory, options, (text) => process.stdout.write(text));
  let buffered = "";
  process.stdin.setEncoding("utf8");
  process.stdin.on("data", (chunk) => {
    buffered += chunk;
    let end;
    while (!state.closed && (end = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, end);
      buffered = buffered.slice(end + 1);
      if (line.trim()) state.receive(line);
    }
    // Nothing after close is read; the process exits once its answer is written.
    if (state.closed) process.stdin.destroy();
  });
}

/** Serve a handler of the contract: tryAcquireLock answers a token, the writes carry one. */
function serve(factory, options = {}) {
  run(factory, { name: options.name, shape: "contract" });
}

/**
 * Serve a handler of the seed's interface unchanged (seed.js): tryAcquireLock answers a
 * boolean and the writes carry no token. The host adapts it (SeedHandlerAdapter) and says
 * "shape": "seed" on open, so dsm verify judges it under the seed profile.
 */
function serveSeed(factory, options = {}) {
  const { SeedHandlerAdapter } = require("./seed.js");
  run(factory, { name: options.name, shape: "seed", adapt: (made) => new SeedHandlerAdapter(made) });
}

module.exports = { LANGUAGE, requestClock, perform, errorBody, serve, serveSeed };
