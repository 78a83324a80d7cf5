#!/usr/bin/env node
// An in-memory DataStateMachine handler speaking the dsm handler protocol
// (docs/protocol.md): one JSON request per line on stdin, one JSON answer per
// line on stdout. Plain Node.js, no packages: it is meant to be read as the
// model for a handler in JavaScript or TypeScript, and it follows
// reference_engine/model.py rule for rule.
//
// Instants are kept as integer microseconds since the epoch, never as Date:
// a Date holds milliseconds, and the kit judges retention 1 microsecond either
// side of a record's end. Payloads are kept as the JSON text the harness sent:
// JSON.parse would turn 1.0 into 1 and round integers past 2**53.
//
//   node handlers/node/memory.js
//   DSM_NODE_BUG=no_fencing node handlers/node/memory.js   (a deliberately broken store)
//   node handlers/node/memory.js --tcp 127.0.0.1:0         (a server: prints where it listens)
//
// On stdin each process is one store. As a server, every connection works in the
// server's one store ("shared_store": true, what dsm stress needs), or in the store its
// open names ("named_store": true: the kit's peers on a test case's store).
//
// DSM_NODE_BUG switches on one realistic bug, so a test can show the kit
// catching it through the protocol:
//   no_fencing         a holder's write lands whatever token the record carries
//   check_then_insert  acquire reads, waits a moment (a store round trip), then writes
//   inclusive_sweep    the catch-up sweep takes locked_until <= now: a live lock, at its last instant

"use strict";

const {
  negotiate,
  SWEEP_ERROR_DETAIL,
  ACQUIRABLE,
  NEEDS_LOCK,
  label,
  parseInstant,
  formatInstant,
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
  keyText,
  writeRecord,
} = require("./rules.js");

const BUG = process.env.DSM_NODE_BUG || "";
if (!["", "no_fencing", "check_then_insert", "inclusive_sweep"].includes(BUG)) {
  process.stderr.write(`memory.js: unknown DSM_NODE_BUG=${BUG}\n`);
  process.exit(2);
}

const COMPLETED = new Set(["processed", "skipped"]);

// --- the store -------------------------------------------------------------------------------

// A store: the current record of each key, and the Superseded ones, oldest first.
const newStore = () => ({ current: new Map(), superseded: [] });

function requireHolder(ctx, record) {
  const token = ctx.lock_token;
  if (BUG === "no_fencing" && record) return record;
  if (!record || record.status !== "processing" || record.attempt !== token) {
    throw new Refusal(
      "stale_lock",
      `stale lock on item ${JSON.stringify(ctx.item_key)}: this execution holds fencing token ${token}, but the record is ${record ? `${label(record.status)} with token ${record.attempt}` : "gone"}; this write is rejected`,
      {
        item_key: ctx.item_key,
        token,
        current_token: record ? record.attempt : null,
        status: record ? label(record.status) : "None",
      },
    );
  }
  return record;
}

function refuseLiveLock(ctx, record, now) {
  if (record && isLive(record, now)) {
    throw new Refusal(
      "lock_held",
      `item ${JSON.stringify(ctx.item_key)} is locked by another worker until ${formatInstant(record.locked_until)}`,
      { item_key: ctx.item_key, locked_until: formatInstant(record.locked_until) },
    );
  }
}

// Insert or update the current record (rules.writeRecord).
function write(store, ctx, now, record, change) {
  writeRecord(store.current, ctx, now, record, change);
}

function acquire(store, ctx, now, record) {
  // Both deadlines before anything is read or written, the lock's first (the model's order).
  lockedUntil(ctx, now);
  retainUntil(ctx, now);
  const source = effectiveStatus(record, now);
  if (!ACQUIRABLE.has(source)) return null;
  checkTransition(source, "processing", ctx);
  const token = record ? record.attempt + 1 : 1;
  write(store, ctx, now, record, {
    status: "processing",
    attempt: token,
    locked_until: lockedUntil(ctx, now),
    error_detail: null,
  });
  return token;
}

const ops = {
  exists(req, now, store) {
    return COMPLETED.has(effectiveStatus(store.current.get(keyText(req.context)), now));
  },

  get(req, now, store) {
    const record = store.current.get(keyText(req.context));
    return record ? wireRecord(record) : null;
  },

  try_acquire_lock(req, now, store) {
    const ctx = req.context;
    if (BUG === "check_then_insert") {
      // The bug: read, then write after a round trip to the store, with no
      // condition on the write: two racers both see the item free.
      const seen = store.current.get(keyText(ctx));
      if (!ACQUIRABLE.has(effectiveStatus(seen, now))) return null;
      const token = seen ? seen.attempt + 1 : 1;
      return new Promise((resolve) =>
        setTimeout(() => {
          write(store, ctx, now, store.current.get(keyText(ctx)), {
            status: "processing",
            attempt: token,
            locked_until: lockedUntil(ctx, now),
            error_detail: null,
          });
          resolve(token);
        }, 5),
      );
    }
    return acquire(store, ctx, now, store.current.get(keyText(ctx)));
  },

  set(req, now, store) {
    const ctx = req.context;
    const status = req.status;
    checkSettable(status);
    checkData(req.data_json);
    retainUntil(ctx, now);
    const record = store.current.get(keyText(ctx));
    if (ctx.lock_token !== null) {
      if (writeLanded(record, ctx.lock_token, status, req.data_json, null)) return null;
      const held = requireHolder(ctx, record);
      checkTransition("processing", status, ctx);
      write(store, ctx, now, held, { status, data_json: req.data_json, locked_until: null });
      return null;
    }
    refuseLiveLock(ctx, record, now);
    if (NEEDS_LOCK.has(status)) {
      throw new Refusal(
        "lock_not_held",
        `set(${label(status)}) on item ${JSON.stringify(ctx.item_key)} needs the processing lock; call try_acquire_lock first`,
        { item_key: ctx.item_key, operation: `set(${label(status)})` },
      );
    }
    checkTransition(effectiveStatus(record, now), status, ctx);
    write(store, ctx, now, record, {
      status,
      data_json: req.data_json,
      locked_until: null,
      attempt: record ? record.attempt : 0,
    });
    return null;
  },

  release_lock_as_failed(req, now, store) {
    const ctx = req.context;
    if (ctx.lock_token === null) {
      throw new Refusal(
        "lock_not_held",
        `release_lock_as_failed on item ${JSON.stringify(ctx.item_key)} needs the processing lock; call try_acquire_lock first`,
        { item_key: ctx.item_key, operation: "release_lock_as_failed" },
      );
    }
    retainUntil(ctx, now);
    const record = store.current.get(keyText(ctx));
    if (writeLanded(record, ctx.lock_token, "failed", null, req.error_detail)) return null;
    const held = requireHolder(ctx, record);
    write(store, ctx, now, held, { status: "failed", locked_until: null, error_detail: req.error_detail });
    return null;
  },

  upsert(req, now, store) {
    const ctx = req.context;
    checkData(req.data_json);
    retainUntil(ctx, now);
    const key = keyText(ctx);
    const record = store.current.get(key);
    if (ctx.lock_token !== null) {
      if (writeLanded(record, ctx.lock_token, "processed", req.data_json, null)) return null;
      const held = requireHolder(ctx, record);
      write(store, ctx, now, held, { status: "processed", data_json: req.data_json, locked_until: null });
      return null;
    }
    refuseLiveLock(ctx, record, now);
    const source = effectiveStatus(record, now);
    if (ACQUIRABLE.has(source)) {
      // The happy path compressed: acquire and complete in one step.
      write(store, ctx, now, record, {
        status: "processed",
        data_json: req.data_json,
        locked_until: null,
        attempt: record ? record.attempt + 1 : 1,
        error_detail: null,
      });
      return null;
    }
    checkTransition(source, "superseded", ctx);
    record.status = "superseded";
    record.updated_at = now;
    store.superseded.push(record);
    store.current.delete(key);
    write(store, ctx, now, undefined, {
      status: "processed",
      data_json: req.data_json,
      locked_until: null,
      attempt: record.attempt,
    });
    return null;
  },

  reset_expired_locks(req, now, store) {
    let count = 0;
    for (const record of store.current.values()) {
      const past = BUG === "inclusive_sweep" ? record.locked_until <= now : record.locked_until < now;
      if (record.status === "processing" && record.locked_until !== null && past) {
        record.status = "failed";
        record.locked_until = null;
        record.error_detail = SWEEP_ERROR_DETAIL;
        record.updated_at = now;
        count += 1;
      }
    }
    return count;
  },

  expire_past_retention(req, now, store) {
    let count = 0;
    for (const record of [...store.current.values(), ...store.superseded]) {
      if (
        record.retain_until !== null &&
        record.retain_until < now &&
        record.status !== "expired" &&
        !isLive(record, now)
      ) {
        record.status = "expired";
        record.locked_until = null;
        record.updated_at = now;
        count += 1;
      }
    }
    return count;
  },
};

// --- the protocol ----------------------------------------------------------------------------

// Named stores (the harness names one per test case on open and opens peers on it) live as
// long as the process; only a server's connections can share them, since a store in this
// process's memory is out of every other process's reach.
const named = new Map(); // store name -> store
// The one store every connection to a server works in when its open names none (dsm stress).
const serverStore = newStore();

// One protocol session: the requests of stdin, or of one server connection.
function session(send, server) {
  let store = null;
  let storeName = null;
  const state = { closed: false, handle };

  function answer(message) {
    send(JSON.stringify(message) + "\n");
  }

  function open(req) {
    if (server && !knowsSecret(req.secret)) {
      state.closed = true; // nothing more is read from a client that cannot authenticate
      throw new Refusal(
        "unauthorized",
        `this handler server takes connections that know its shared secret, and this open carried ${
          typeof req.secret === "string" ? "a wrong secret" : "no secret"
        }; the harness sends it from DSM_SERVE_SECRET, DSM_SERVE_SECRET_FILE, or on loopback the file the server wrote when it started`,
      );
    }
    const protocol = negotiate(req);
    const wanted = server && typeof req.store === "string" ? req.store : null;
    if (wanted) {
      if (!named.has(wanted)) named.set(wanted, newStore());
      storeName = wanted;
      store = named.get(wanted);
    } else {
      store = server ? serverStore : newStore();
    }
    return {
      protocol,
      concurrent: true,
      name: "node in-memory" + (BUG ? ` (bug: ${BUG})` : ""),
      shared_store: server && !wanted,
      named_store: Boolean(wanted),
    };
  }

  function handle(line) {
    let req;
    try {
      req = JSON.parse(line);
    } catch (err) {
      process.stderr.write(`memory.js: a request is not JSON (${err.message}); ignored\n`);
      return;
    }
    const id = req && req.id;
    const reply = (result) => answer({ id, result: result === undefined ? null : result });
    const refuse = (err) => {
      if (err instanceof Refusal) answer({ id, error: err.body });
      else answer({ id, error: { kind: "internal", message: String(err && err.stack), type: String(err && err.name) } });
    };
    try {
      const now = parseInstant(req.now);
      if (req.op === "open") return reply(open(req));
      if (req.op === "close") {
        state.closed = true;
        if (storeName && req.drop_store === true) named.delete(storeName);
        return reply(null);
      }
      if (!store) throw new Refusal("bad_request", `${JSON.stringify(req.op)} before open`);
      const op = Object.prototype.hasOwnProperty.call(ops, req.op) ? ops[req.op] : null;
      if (!op) throw new Refusal("bad_request", `unknown op ${JSON.stringify(req.op)}`);
      const result = op(req, now, store);
      if (result instanceof Promise) result.then(reply, refuse);
      else reply(result);
    } catch (err) {
      refuse(err);
    }
  }

  return state;
}

// Feed a stream's lines to a session until it closes.
function serveLines(stream, state, onClosed) {
  let buffered = "";
  stream.setEncoding("utf8");
  stream.on("data", (chunk) => {
    buffered += chunk;
    let end;
    while (!state.closed && (end = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, end);
      buffered = buffered.slice(end + 1);
      if (line.trim()) state.handle(line);
    }
    if (state.closed) onClosed();
  });
}

// --- the shared secret of a server (docs/protocol.md, "Authentication") -----------------------

const crypto = require("node:crypto");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

let SECRET = null; // every server connection's open must carry it
let secretWritten = null; // the file a drawn secret was written to, removed at exit

function knowsSecret(given) {
  if (typeof given !== "string") return false;
  const a = Buffer.from(SECRET, "utf8");
  const b = Buffer.from(given, "utf8");
  return a.length === b.length && crypto.timingSafeEqual(a, b);
}

function isLoopback(host) {
  return host === "localhost" || host === "::1" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

// The dsm cache directory (dsm_sim/conformance/cache.py): where a loopback server's drawn
// secret is written, and where the harness looks for it by the address it connects to.
function secretPath(host, port) {
  const xdg = (process.env.XDG_CACHE_HOME || "").trim();
  const dir = (process.env.DSM_CACHE_DIR || "").trim() || path.join(xdg || path.join(os.homedir(), ".cache"), "dsm");
  return path.join(dir, "serve", `${host.replace(/[:/]/g, "_")}-${port}.secret`);
}

function configuredSecret() {
  const given = (process.env.DSM_SERVE_SECRET || "").trim();
  if (given) return given;
  const file = (process.env.DSM_SERVE_SECRET_FILE || "").trim();
  if (!file) return null;
  const text = fs.readFileSync(file, "utf8").trim();
  if (!text) throw new Error(`the secret file ${JSON.stringify(file)} is empty`);
  return text;
}

function writeSecret(host, port) {
  const target = secretPath(host, port);
  fs.mkdirSync(path.dirname(target), { recursive: true, mode: 0o700 });
  const temporary = `${target}.${process.pid}.tmp`;
  fs.writeFileSync(temporary, SECRET + "\n", { mode: 0o600, flag: "wx" });
  fs.renameSync(temporary, target);
  secretWritten = target;
}

function removeSecret() {
  if (secretWritten) {
    try {
      fs.unlinkSync(secretWritten);
    } catch (err) {
      // already gone
    }
    secretWritten = null;
  }
}

// `node memory.js --tcp HOST:PORT` serves connections instead of stdin: each is a session,
// and they share the server's store (or the store their open names), so the kit can race
// peers and `dsm stress --handler exec-tcp:HOST:PORT` can run its processes on one store.
const tcpAt = process.argv.indexOf("--tcp");
if (tcpAt >= 0) {
  const address = process.argv[tcpAt + 1] || "";
  const m = /^(.+):(\d+)$/.exec(address);
  if (!m) {
    process.stderr.write(`memory.js: --tcp wants HOST:PORT, got ${JSON.stringify(address)}\n`);
    process.exit(2);
  }
  const host = m[1].replace(/^\[|\]$/g, "");
  try {
    SECRET = configuredSecret();
  } catch (err) {
    process.stderr.write(`memory.js: ${err.message}\n`);
    process.exit(2);
  }
  const drawn = SECRET === null;
  if (drawn && !isLoopback(host)) {
    process.stderr.write(
      `memory.js: --tcp on ${JSON.stringify(host)}, which is not a loopback address, needs a shared secret: ` +
        "set DSM_SERVE_SECRET (or DSM_SERVE_SECRET_FILE) here and in the harness's environment\n",
    );
    process.exit(2);
  }
  if (drawn) SECRET = crypto.randomBytes(32).toString("base64url");
  const net = require("node:net");
  const server = net.createServer((socket) => {
    const state = session((text) => socket.write(text), true);
    serveLines(socket, state, () => socket.end());
    socket.on("error", () => socket.destroy());
  });
  for (const signal of ["SIGTERM", "SIGINT"]) {
    process.on(signal, () => {
      removeSecret();
      process.exit(0);
    });
  }
  process.on("exit", removeSecret);
  server.listen(+m[2], host, () => {
    const where = server.address();
    if (drawn) writeSecret(host, where.port);
    const shown = secretWritten ? ` (secret in ${secretWritten})` : "";
    process.stdout.write(`memory.js: listening on ${where.address}:${where.port}${shown}\n`);
  });
} else {
  const state = session((text) => process.stdout.write(text), false);
  serveLines(process.stdin, state, () => process.stdin.destroy());
}
