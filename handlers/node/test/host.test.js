// The Node host through its pipe: a contract handler and a seed-shaped one behind serve and
// serveSeed, each process started as the kit starts it, its answers read back by id.
//
//   node --test handlers/node/test/

"use strict";

const test = require("node:test");
const assert = require("node:assert/strict");
const path = require("node:path");
const { spawn } = require("node:child_process");
const { once } = require("node:events");
const readline = require("node:readline");

const HOST = path.join(__dirname, "..");
const NOW = "2026-03-02T09:00:00.000000Z";
const LATER = "2026-03-02T09:31:00.000000Z";
const CTX = {
  tenant_id: "t1", source_app_id: "app-1", scope_id: 4, scope_code: "Element", entity_id: "flow-1",
  entity_execution_id: "run-1", item_entity_key: "", item_key: "INV-1",
  lock_duration_us: 1800000000, retention_us: null, lock_token: null,
};

// Run `program` (a module's text) and send it `requests` one at a time, each after the answer
// to the one before (a string is sent as it is and answered by nobody): the answers by id.
async function answers(program, requests) {
  const child = spawn(process.execPath, ["-e", program], { cwd: HOST, stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const lines = readline.createInterface({ input: child.stdout });
  const waiting = new Map();
  lines.on("line", (line) => {
    const message = JSON.parse(line);
    waiting.get(message.id)(message);
  });
  const byId = {};
  for (const [index, request] of requests.entries()) {
    if (typeof request === "string") {
      child.stdin.write(request + "\n");
      continue;
    }
    const id = index + 1;
    const answered = new Promise((resolve) => waiting.set(id, resolve));
    child.stdin.write(JSON.stringify({ id, ...request }) + "\n");
    byId[id] = await answered;
  }
  child.stdin.end();
  const [status] = await once(child, "exit");
  assert.equal(status, 0, stderr);
  return { byId, stderr };
}

const SEED = `
  const { serveSeed } = require("./host.js");
  const { SeedMemoryHandler } = require("./seed-memory.js");
  serveSeed((clock) => new SeedMemoryHandler(clock), { name: "seed" });`;

// The contract: the seed handler behind the adapter, as a handler with tokens.
const CONTRACT = `
  const { serve } = require("./host.js");
  const { SeedHandlerAdapter } = require("./seed.js");
  const { SeedMemoryHandler } = require("./seed-memory.js");
  serve((clock) => new SeedHandlerAdapter(new SeedMemoryHandler(clock)), { name: "contract" });`;

test("serveSeed says its shape and language, and answers the seed's calls as the contract's", async () => {
  const { byId, stderr } = await answers(SEED, [
    { op: "open", now: NOW, protocol: 1, protocols: [1, 2] },
    { op: "try_acquire_lock", now: NOW, context: CTX },
    { op: "try_acquire_lock", now: NOW, context: { ...CTX, entity_execution_id: "run-2" } },
    "not json",
    { op: "try_acquire_lock", now: LATER, context: { ...CTX, entity_execution_id: "run-2" } },
    // The first holder, swept by the take-over, writes late: the seed's interface lets it land.
    { op: "set", now: LATER, context: { ...CTX, lock_token: 1 }, status: "processed", data_json: '{"n":1}' },
    { op: "get", now: LATER, context: CTX },
    { op: "release_lock_as_failed", now: LATER, context: { ...CTX, lock_token: 2 }, error_detail: "x" },
    { op: "frobnicate", now: LATER, context: CTX },
    { op: "reset_expired_locks", now: LATER },
    { op: "close", now: LATER },
  ]);
  assert.deepEqual(byId[1].result, {
    protocol: 2, concurrent: true, name: "seed", shared_store: false, named_store: false,
    shape: "seed", language: "node",
  });
  assert.equal(byId[2].result, 1);
  assert.equal(byId[3].result, null);
  assert.match(stderr, /not JSON/);
  assert.equal(byId[5].result, 2); // the record's attempt, read back
  assert.equal(byId[6].result, null);
  assert.equal(byId[7].result.status, "processed");
  assert.equal(byId[7].result.locked_until, null);
  assert.equal(byId[7].result.data_json, '{"n":1}');
  assert.equal(byId[8].error.kind, "lock_not_held");
  assert.equal(byId[9].error.kind, "bad_request");
  assert.equal(byId[10].result, 0);
  assert.equal(byId[11].result, null);
});

test("serve says the contract's shape and passes the tokens through", async () => {
  const { byId } = await answers(CONTRACT, [
    { op: "open", now: NOW, protocol: 1, protocols: [1, 2] },
    { op: "try_acquire_lock", now: NOW, context: CTX },
    { op: "exists", now: NOW, context: CTX },
    { op: "close", now: NOW },
  ]);
  assert.equal(byId[1].result.shape, "contract");
  assert.equal(byId[1].result.language, "node");
  assert.equal(byId[2].result, 1);
  assert.equal(byId[3].result, false);
});

test("a request before open, and an open that does not offer version 2, are refused by name", async () => {
  const { byId } = await answers(SEED, [
    { op: "get", now: NOW, context: CTX },
    { op: "open", now: NOW, protocol: 1 },
    { op: "close", now: NOW },
  ]);
  assert.equal(byId[1].error.kind, "bad_request");
  assert.match(byId[1].error.message, /before open/);
  assert.equal(byId[2].error.kind, "bad_request");
  assert.match(byId[2].error.message, /speaks protocol version 2; open offered 1/);
});

test("ProtocolSteps answers through the contract at the manual clock's instant", async () => {
  const { ManualClock, ProtocolSteps } = require("../steps.js");
  const { SeedMemoryHandler } = require("../seed-memory.js");
  const clock = new ManualClock();
  const steps = new ProtocolSteps(new SeedMemoryHandler(clock), clock, { shape: "seed" });
  await steps.open();
  steps.at(NOW);
  assert.equal(await steps.tryAcquireLock(CTX), 1);
  assert.deepEqual(await steps.set(CTX, "superseded", null), { error: "unsupported_status" });
  assert.equal((await steps.get(CTX)).locked_until, "2026-03-02T09:30:00.000000Z");
  steps.at(LATER);
  assert.equal(await steps.resetExpiredLocks(), 1);
  assert.throws(() => new ProtocolSteps(new SeedMemoryHandler(clock), clock, { shape: "tokens" }), RangeError);
  await steps.close();
});

test("a factory that takes a store name gets the one open names, and says so", async () => {
  const program = `
    const { serveSeed } = require("./host.js");
    const { SeedMemoryHandler } = require("./seed-memory.js");
    serveSeed((clock, store) => {
      const handler = new SeedMemoryHandler(clock);
      handler.close = (drop) => process.stderr.write("closed " + store + " drop=" + drop + "\\n");
      return handler;
    });`;
  const { byId, stderr } = await answers(program, [
    { op: "open", now: NOW, protocol: 1, protocols: [1, 2], store: "dsm_0123456789abcdef" },
    { op: "close", now: NOW, drop_store: true },
  ]);
  assert.equal(byId[1].result.named_store, true);
  assert.match(stderr, /closed dsm_0123456789abcdef drop=true/);
  const plain = await answers(SEED, [
    { op: "open", now: NOW, protocol: 1, protocols: [1, 2], store: "dsm_0123456789abcdef" },
    { op: "close", now: NOW },
  ]);
  assert.equal(plain.byId[1].result.named_store, false);
});
