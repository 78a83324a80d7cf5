#!/usr/bin/env node
// A PostgreSQL DataStateMachine handler speaking the dsm handler protocol
// (docs/protocol.md), on the `pg` package (npm ci in this directory). It makes
// the same decisions as memory.js, rule for rule, but each operation is one SQL
// statement where PostgreSQL allows, so that the database, not this process,
// makes it atomic: requests run concurrently on a connection pool and really
// race in the database, as several workers of one service would.
//
//   DSM_NODE_PG_URL=postgresql://postgres@127.0.0.1:5432/test node handlers/node/postgres.js
//
// Where the records live:
//   * By default the store is a schema named on `open`: dsm_node_<store> when
//     the harness names a store (the kit and the simulator name a fresh one
//     per test case or run, and open more processes on it to race them; the
//     process answers "named_store": true), else dsm_node_<16 hex> of its own.
//     It holds one table, dsm_node_state, and is dropped on the close that
//     says drop_store (or on close, for a schema of its own). Every process
//     working in a schema holds a shared session advisory lock named after
//     it, so a schema left behind by killed processes (their locks gone with
//     their connections) is dropped by the next process that opens.
//   * Under `dsm stress` (DSM_STRESS_DB_URL names a PostgreSQL database, a
//     SQLAlchemy URL whose +driver is dropped) the table is created, if
//     missing, in DSM_STRESS_SCHEMA (the run drops that schema) and kept.
//   * DSM_NODE_PG_TABLE (optionally with DSM_NODE_PG_SCHEMA) names a table
//     that is created if missing and kept.
// Only the last two are one store for every process with this environment, so
// only they answer open with "shared_store": true.
//
// Instants are integer microseconds since the epoch (BigInt here, bigint columns), computed
// from each request's `now`; the database clock is never read. Payloads are
// stored as the JSON text the harness sent (a text column, never jsonb, which
// would turn 1.0 into 1 and refuse \u0000).
//
// DSM_NODE_BUG=check_then_insert switches on a deliberately broken acquire: it
// reads the row, then writes the lock with an unconditional upsert, so two
// racers that both read "free" both get the lock.
// DSM_NODE_PG_POOL sets the pool size (4 by default).
// DSM_NODE_PG_SERIAL=1 makes the process serve one request at a time and say
// so ("concurrent": false): its races then happen only between processes on
// one named store, which is how the kit reaches such a handler.

"use strict";

const {
  negotiate,
  SWEEP_ERROR_DETAIL,
  TRANSITIONS,
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
} = require("./rules.js");

const crypto = require("node:crypto");
const pg = require("pg");

//: How often an operation is run again when a concurrent writer changed the row
//: between its statement and the follow-up read; each lost race means another
//: writer finished, so the bound only turns pathological contention into an error.
const RACE_RETRIES = 10;
const OWN_SCHEMA_PREFIX = "dsm_node_";
const OWN_SCHEMA = /^dsm_node_[a-z0-9_]+$/;
//: What a store name from the harness looks like (the protocol's pattern).
const STORE_NAME = /^[a-z][a-z0-9_]{0,39}$/;
//: The first key of the session advisory locks that mark a process's own schema live.
const LOCK_CLASS = 0x64736d; // "dsm"
const BUG = process.env.DSM_NODE_BUG || "";
if (!["", "check_then_insert"].includes(BUG)) {
  process.stderr.write(`postgres.js: unknown DSM_NODE_BUG=${BUG}\n`);
  process.exit(2);
}

const STATUSES = Object.keys(TRANSITIONS);

const sourcesOf = (target) => new Set(STATUSES.filter((source) => TRANSITIONS[source].includes(target)));

// --- where the store is ----------------------------------------------------------------------

const quote = (name) => `"${name.replace(/"/g, '""')}"`;

// A SQLAlchemy URL (postgresql+asyncpg://...) as a libpq one; null for another database.
function libpqUrl(url) {
  const m = /^(postgres(?:ql)?)(\+[A-Za-z0-9_]+)?:\/\//.exec(url.trim());
  return m ? "postgresql://" + url.trim().slice(m[0].length) : null;
}

function location(env) {
  const stressUrl = libpqUrl(env.DSM_STRESS_DB_URL || "");
  if (stressUrl) {
    return {
      url: stressUrl,
      schema: (env.DSM_STRESS_SCHEMA || "").trim() || null,
      table: (env.DSM_NODE_PG_TABLE || "").trim() || "dsm_node_state",
      own: false,
    };
  }
  const url = (env.DSM_NODE_PG_URL || "").trim();
  if (!url) return { error: "set DSM_NODE_PG_URL to a PostgreSQL URL (postgresql://user@host:5432/db)" };
  const libpq = libpqUrl(url);
  if (!libpq) return { error: `DSM_NODE_PG_URL is not a PostgreSQL URL: ${JSON.stringify(url)}` };
  const table = (env.DSM_NODE_PG_TABLE || "").trim();
  if (table) return { url: libpq, schema: (env.DSM_NODE_PG_SCHEMA || "").trim() || null, table, own: false };
  // The schema is chosen on open, from the store the harness names.
  return { url: libpq, schema: null, table: "dsm_node_state", own: true };
}

const WHERE = location(process.env);
const POOL_SIZE = Math.max(1, parseInt(process.env.DSM_NODE_PG_POOL || "", 10) || 4);
const SERIAL = (process.env.DSM_NODE_PG_SERIAL || "").trim() === "1";

// --- the SQL ---------------------------------------------------------------------------------

// The table, and the statements on it: fixed by place() before the first statement runs.
let T = null;
let SQL = null;
const COLUMNS =
  "tenant_id, scope_id, scope_code, entity_id, item_entity_key, item_key, status, attempt, " +
  "locked_until, data_json, error_detail, entity_execution_id, source_app_id, created_at, " +
  "updated_at, retain_until";
// The SHA-256 of a record key whose parts are the SQL expressions given, each part framed by
// its length in characters and a colon, so no two keys hash alike but through a collision.
// A key part may be 256 characters of 4-byte UTF-8, and a B-tree index row holds at most
// 2704 bytes: the unique index is on this hash, never on the parts. decode(.., 'escape') of
// the text with its backslashes doubled is its bytes, and immutable, as a generated column
// needs (convert_to is only stable).
function keyHash(tenant, scope, entity, entityKey, key) {
  const parts = [tenant, `CAST(${scope} AS text)`, entity, entityKey, key];
  const framed = parts.map((part) => `CAST(length(${part}) AS text) || ':' || ${part}`).join(" || ");
  return `sha256(decode(replace(${framed}, E'\\\\', E'\\\\\\\\'), 'escape'))`;
}
const KEY_HASH = keyHash("tenant_id", "scope_id", "entity_id", "item_entity_key", "item_key");
// The key's current row, as parameters $1..$5: found through the hash's index, and compared
// part by part. Keys are "C"-collated text: compared byte for byte.
const KEY =
  `key_hash = ${keyHash("$1::text", "$2::bigint", "$3::text", "$4::text", "$5::text")} ` +
  "AND tenant_id = $1::text AND scope_id = $2::bigint AND entity_id = $3::text " +
  "AND item_entity_key = $4::text AND item_key = $5::text AND NOT superseded";
const CONFLICT = "ON CONFLICT (key_hash) WHERE NOT superseded";

function ddl() {
  const text = 'text COLLATE "C" NOT NULL';
  return [
    WHERE.schema ? `CREATE SCHEMA IF NOT EXISTS ${quote(WHERE.schema)}` : null,
    `CREATE TABLE IF NOT EXISTS ${T} (
      id bigserial PRIMARY KEY,
      tenant_id ${text}, scope_id bigint NOT NULL, scope_code text NOT NULL,
      entity_id ${text}, item_entity_key ${text}, item_key ${text},
      status text NOT NULL, attempt bigint NOT NULL, locked_until bigint,
      data_json text, error_detail text,
      entity_execution_id text NOT NULL, source_app_id text NOT NULL,
      created_at bigint NOT NULL, updated_at bigint NOT NULL, retain_until bigint,
      superseded boolean NOT NULL DEFAULT false,
      key_hash bytea GENERATED ALWAYS AS (${KEY_HASH}) STORED)`,
  ].filter(Boolean);
}

// A table kept from an earlier version (DSM_NODE_PG_TABLE, a stress run's) has no key_hash: it
// gets the column, and its unique index over the parts goes. Run only when the column is
// missing, so a normal start takes no exclusive lock on the table.
function migration() {
  const prefix = WHERE.schema ? quote(WHERE.schema) + "." : "";
  return [
    `ALTER TABLE ${T} ADD COLUMN key_hash bytea GENERATED ALWAYS AS (${KEY_HASH}) STORED`,
    `DROP INDEX IF EXISTS ${prefix}${quote(`${indexPrefix()}_current`)}`,
  ];
}
const HAS_KEY_HASH =
  "SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'key_hash' AND NOT attisdropped";
const indexPrefix = () => (WHERE.table || "dsm_node_state").slice(0, 50);
const keyIndex = () =>
  `CREATE UNIQUE INDEX IF NOT EXISTS ${quote(`${indexPrefix()}_key_hash`)} ON ${T} (key_hash) WHERE NOT superseded`;

// SQL for "the row's effective status is one of `statuses`" at `now` (the parameter named
// by `now`): an expired, unswept lock counts as Failed, a live one as Processing. "none" (no
// row) is left to the statement's INSERT.
function effectiveIn(statuses, now, alias) {
  const c = (column) => (alias ? `${alias}.${column}` : column);
  const clauses = [];
  const plain = STATUSES.filter((s) => statuses.has(s) && s !== "none" && s !== "processing");
  if (plain.length) clauses.push(`${c("status")} IN (${plain.map((s) => `'${s}'`).join(", ")})`);
  if (statuses.has("failed")) {
    clauses.push(`(${c("status")} = 'processing' AND (${c("locked_until")} IS NULL OR ${c("locked_until")} < ${now}))`);
  }
  if (statuses.has("processing")) clauses.push(`(${c("status")} = 'processing' AND ${c("locked_until")} >= ${now})`);
  return clauses.length ? `(${clauses.join(" OR ")})` : "false";
}

// A new row, from the parameters of the statements that insert: $1 .. $5 the key, then
//   $6 scope_code  $7 data_json  $8 entity_execution_id  $9 source_app_id  $10 now  $11 retain_until
const NEW_ROW = (status, attempt, lockedUntil) =>
  `$1::text, $2::bigint, $6::text, $3::text, $4::text, $5::text, '${status}', ${attempt}, ${lockedUntil}, ` +
  "$7::text, NULL, $8::text, $9::text, $10::bigint, $10::bigint, $11::bigint";
const STAMP =
  "entity_execution_id = EXCLUDED.entity_execution_id, source_app_id = EXCLUDED.source_app_id, " +
  "updated_at = EXCLUDED.updated_at, retain_until = EXCLUDED.retain_until";
const FRESH = ACQUIRABLE;

const statements = () => ({
  exists: `SELECT 1 FROM ${T} WHERE ${KEY} AND status IN ('processed', 'skipped')`,
  current: `SELECT ${COLUMNS} FROM ${T} WHERE ${KEY}`,
  liveLock: `SELECT locked_until FROM ${T} WHERE ${KEY} AND status = 'processing' AND locked_until >= $6::bigint`,
  // $6 scope_code, $7 the new lock's locked_until, $8 .. $11 the stamp.
  acquire:
    `INSERT INTO ${T} AS t (${COLUMNS}) VALUES (` +
    "$1::text, $2::bigint, $6::text, $3::text, $4::text, $5::text, 'processing', 1, $7::bigint, " +
    "NULL, NULL, $8::text, $9::text, $10::bigint, $10::bigint, $11::bigint) " +
    `${CONFLICT} DO UPDATE SET status = 'processing', attempt = t.attempt + 1, ` +
    `locked_until = EXCLUDED.locked_until, error_detail = NULL, ${STAMP} ` +
    `WHERE ${effectiveIn(FRESH, "$10::bigint", "t")} RETURNING attempt`,
  // The bug of DSM_NODE_BUG=check_then_insert: the decision was made on an earlier read,
  // and $12 is the token computed from it.
  acquireBlindly:
    `INSERT INTO ${T} AS t (${COLUMNS}) VALUES (` +
    "$1::text, $2::bigint, $6::text, $3::text, $4::text, $5::text, 'processing', $12::bigint, $7::bigint, " +
    "NULL, NULL, $8::text, $9::text, $10::bigint, $10::bigint, $11::bigint) " +
    `${CONFLICT} DO UPDATE SET status = 'processing', attempt = EXCLUDED.attempt, ` +
    `locked_until = EXCLUDED.locked_until, error_detail = NULL, ${STAMP}`,
  // set and upsert with a token: $6 the target status, $7 the data, $8 .. $11 the stamp,
  // $12 the caller's token.
  fencedSet:
    `UPDATE ${T} SET status = $6::text, locked_until = NULL, data_json = COALESCE($7::text, data_json), ` +
    "entity_execution_id = $8::text, source_app_id = $9::text, updated_at = $10::bigint, retain_until = $11::bigint " +
    `WHERE ${KEY} AND status = 'processing' AND attempt = $12::bigint RETURNING id`,
  // $6 the error detail, $7 .. $10 the stamp, $11 the caller's token.
  fencedRelease:
    `UPDATE ${T} SET status = 'failed', locked_until = NULL, error_detail = $6::text, ` +
    "entity_execution_id = $7::text, source_app_id = $8::text, updated_at = $9::bigint, retain_until = $10::bigint " +
    `WHERE ${KEY} AND status = 'processing' AND attempt = $11::bigint RETURNING id`,
  // set(Skipped) without a token: every source but a live lock, a missing record included.
  setSkipped:
    `INSERT INTO ${T} AS t (${COLUMNS}) VALUES (${NEW_ROW("skipped", 0, "NULL")}) ` +
    `${CONFLICT} DO UPDATE SET status = 'skipped', locked_until = NULL, ` +
    `data_json = COALESCE(EXCLUDED.data_json, t.data_json), ${STAMP} ` +
    `WHERE ${effectiveIn(new Set([...sourcesOf("skipped")].filter((s) => s !== "processing")), "$10::bigint", "t")} ` +
    "RETURNING id",
  // set(Expired) without a token: None -> Expired is not in the table, so no insert.
  // $6 the data, $7 .. $10 the stamp.
  setExpired:
    `UPDATE ${T} SET status = 'expired', locked_until = NULL, data_json = COALESCE($6::text, data_json), ` +
    "entity_execution_id = $7::text, source_app_id = $8::text, updated_at = $9::bigint, retain_until = $10::bigint " +
    `WHERE ${KEY} AND ${effectiveIn(new Set([...sourcesOf("expired")].filter((s) => s !== "processing")), "$9::bigint")} ` +
    "RETURNING id",
  // upsert without a token, one statement: supersede a Processed row and insert its
  // successor with the same attempt, or else acquire-and-complete a fresh one.
  upsert:
    `WITH old AS (UPDATE ${T} SET status = 'superseded', superseded = true, updated_at = $10::bigint ` +
    `WHERE ${KEY} AND status = 'processed' RETURNING attempt), ` +
    `successor AS (INSERT INTO ${T} (${COLUMNS}) SELECT ${NEW_ROW("processed", "old.attempt", "NULL")} ` +
    "FROM old RETURNING attempt), " +
    `fresh AS (INSERT INTO ${T} AS t (${COLUMNS}) SELECT ${NEW_ROW("processed", 1, "NULL")} ` +
    "WHERE NOT EXISTS (SELECT 1 FROM old) " +
    `${CONFLICT} DO UPDATE SET status = 'processed', attempt = t.attempt + 1, locked_until = NULL, ` +
    `data_json = COALESCE(EXCLUDED.data_json, t.data_json), error_detail = NULL, ${STAMP} ` +
    `WHERE ${effectiveIn(FRESH, "$10::bigint", "t")} RETURNING attempt) ` +
    "SELECT (SELECT count(*) FROM successor) + (SELECT count(*) FROM fresh) AS written",
  resetExpiredLocks:
    `UPDATE ${T} SET status = 'failed', locked_until = NULL, error_detail = $2::text, updated_at = $1::bigint ` +
    "WHERE status = 'processing' AND locked_until < $1::bigint AND NOT superseded",
  expirePastRetention:
    `UPDATE ${T} SET status = 'expired', locked_until = NULL, updated_at = $1::bigint ` +
    "WHERE retain_until < $1::bigint AND status <> 'expired' " +
    "AND (status <> 'processing' OR locked_until IS NULL OR locked_until < $1::bigint)",
});

// Work in `schema` (or the connection's search path, for null) from now on.
function place(schema) {
  WHERE.schema = schema;
  T = (schema ? quote(schema) + "." : "") + quote(WHERE.table || "dsm_node_state");
  SQL = statements();
}

// --- the connections -------------------------------------------------------------------------

const int = (value) => (value === null ? null : Number(value));
// bigint columns come back as text: instants stay exact as BigInt.
const micros = (value) => (value === null ? null : BigInt(value));

let pool = null;
let keeper = null; // the connection that holds this process's lock on its schema (own schemas only)
let named = false; // whether the schema is the store the harness named on open

async function prepare() {
  if (WHERE.error) throw new Refusal("store_error", `postgres.js: ${WHERE.error}`);
  pool = new pg.Pool({
    connectionString: WHERE.url,
    max: POOL_SIZE,
    connectionTimeoutMillis: 5000,
    statement_timeout: 5000,
    lock_timeout: 5000,
    application_name: "dsm postgres.js",
  });
  pool.on("error", (err) => process.stderr.write(`postgres.js: idle connection failed: ${err.message}\n`));
  if (!WHERE.own) {
    place(WHERE.schema);
    await createTable(pool);
  }
  // One pooled connection ready before the first request.
  (await pool.connect()).release();
}

// Several processes create one table at once (a stress run, peers on a named store): one at a time.
async function createTable(on) {
  const client = await on.connect();
  try {
    await client.query("BEGIN");
    await client.query("SELECT pg_advisory_xact_lock($1, hashtext($2))", [LOCK_CLASS, T]);
    for (const statement of ddl()) await client.query(statement);
    if (!(await client.query(HAS_KEY_HASH, [T])).rows.length) {
      for (const statement of migration()) await client.query(statement);
    }
    await client.query(keyIndex());
    await client.query("COMMIT");
  } catch (err) {
    await client.query("ROLLBACK").catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}

// Open the store: the named one, shared with every process that names it, or one of our own.
// The shared lock is taken before the schema exists, so no other process takes it for an orphan.
async function claimSchema(store) {
  if (store !== undefined && store !== null && !STORE_NAME.test(store)) {
    throw new Refusal("bad_request", `store: not a store name: ${JSON.stringify(store)}`);
  }
  named = Boolean(store);
  place(OWN_SCHEMA_PREFIX + (named ? store : crypto.randomBytes(8).toString("hex")));
  keeper = new pg.Client({ connectionString: WHERE.url, application_name: "dsm postgres.js" });
  keeper.on("error", (err) => process.stderr.write(`postgres.js: schema keeper failed: ${err.message}\n`));
  await keeper.connect();
  await keeper.query("SELECT pg_advisory_lock_shared($1, hashtext($2))", [LOCK_CLASS, WHERE.schema]);
  await dropOrphans(keeper);
  await createTable(pool);
}

// Drop the schemas whose processes all died without closing: nobody holds their lock.
async function dropOrphans(client) {
  const found = await client.query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'dsm\\_node\\_%'");
  for (const { nspname } of found.rows) {
    if (!OWN_SCHEMA.test(nspname) || nspname === WHERE.schema) continue;
    const { rows } = await client.query("SELECT pg_try_advisory_lock($1, hashtext($2)) AS free", [LOCK_CLASS, nspname]);
    if (!rows[0].free) continue;
    try {
      await client.query(`DROP SCHEMA IF EXISTS ${quote(nspname)} CASCADE`);
    } finally {
      await client.query("SELECT pg_advisory_unlock($1, hashtext($2))", [LOCK_CLASS, nspname]);
    }
  }
}

// Leave the store; drop it when it is ours alone, or when the harness says this is its last process.
async function finish(drop) {
  try {
    if (keeper) {
      if (drop || !named) await keeper.query(`DROP SCHEMA IF EXISTS ${quote(WHERE.schema)} CASCADE`);
      await keeper.end();
      keeper = null;
    }
  } finally {
    if (pool) {
      const ending = pool;
      pool = null;
      await ending.end();
    }
  }
}

const ready = prepare();
ready.catch(() => {}); // reported by the first request that waits for it

async function query(name, values) {
  await ready;
  try {
    return await pool.query({ name, text: SQL[name], values });
  } catch (err) {
    throw new Refusal("store_error", `PostgreSQL refused ${name}: ${err.message}`);
  }
}

function keyParams(ctx) {
  return [ctx.tenant_id, ctx.scope_id, ctx.entity_id, ctx.item_entity_key, ctx.item_key];
}

// Who wrote, when, and how long to keep the row: refreshed by every write.
function stamp(ctx, now) {
  return [ctx.entity_execution_id, ctx.source_app_id, now, retainUntil(ctx, now)];
}

// The parameters of a statement: the key ($1 .. $5), then `values` in order.
const bind = (ctx, ...values) => [...keyParams(ctx), ...values];

function toRecord(row) {
  return {
    key: {
      tenant_id: row.tenant_id,
      scope_id: int(row.scope_id),
      entity_id: row.entity_id,
      item_entity_key: row.item_entity_key,
      item_key: row.item_key,
    },
    status: row.status,
    attempt: int(row.attempt),
    locked_until: micros(row.locked_until),
    data_json: row.data_json,
    error_detail: row.error_detail,
    entity_execution_id: row.entity_execution_id,
    source_app_id: row.source_app_id,
    created_at: micros(row.created_at),
    updated_at: micros(row.updated_at),
    retain_until: micros(row.retain_until),
  };
}

async function currentRecord(ctx) {
  const { rows } = await query("current", keyParams(ctx));
  return rows.length ? toRecord(rows[0]) : null;
}

// --- the rules (as in memory.js) -------------------------------------------------------------

function staleLock(ctx, record) {
  const token = ctx.lock_token;
  return new Refusal(
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

function lockHeld(ctx, lockedUntil) {
  return new Refusal(
    "lock_held",
    `item ${JSON.stringify(ctx.item_key)} is locked by another worker until ${formatInstant(lockedUntil)}`,
    { item_key: ctx.item_key, locked_until: formatInstant(lockedUntil) },
  );
}

function refuseLiveLock(ctx, record, now) {
  if (record && isLive(record, now)) throw lockHeld(ctx, record.locked_until);
}

function lostRaces(ctx, op) {
  return new Refusal("store_error", `${op} on item ${JSON.stringify(ctx.item_key)} kept losing races`);
}

// UPDATE ... WHERE status = 'processing' AND attempt = token; when no row matched, one read
// tells a landed retry (success, nothing written) from a stale token. The read may see a
// later state than the UPDATE did; it decides the same way, since the answer changes
// nothing and tokens only grow. Only a row back under this very token (a token from the
// future that an acquire has since reached) sends the write round again.
async function fenced(ctx, statement, params, status, dataJson, errorDetail) {
  for (let round = 0; round < RACE_RETRIES; round++) {
    if ((await query(statement, params)).rowCount) return null;
    const record = await currentRecord(ctx);
    if (writeLanded(record, ctx.lock_token, status, dataJson, errorDetail)) return null;
    if (!record || record.status !== "processing" || record.attempt !== ctx.lock_token) {
      throw staleLock(ctx, record);
    }
  }
  throw lostRaces(ctx, "a fenced write");
}

const ops = {
  async exists(req, now) {
    return (await query("exists", keyParams(req.context))).rowCount > 0;
  },

  async get(req) {
    const record = await currentRecord(req.context);
    return record ? wireRecord(record) : null;
  },

  async try_acquire_lock(req, now) {
    const ctx = req.context;
    const params = bind(ctx, ctx.scope_code, lockedUntil(ctx, now), ...stamp(ctx, now));
    if (BUG === "check_then_insert") {
      const seen = await currentRecord(ctx);
      if (!ACQUIRABLE.has(effectiveStatus(seen, now))) return null;
      const token = seen ? seen.attempt + 1 : 1;
      await query("acquireBlindly", [...params, token]);
      return token;
    }
    const { rows } = await query("acquire", params);
    return rows.length ? int(rows[0].attempt) : null;
  },

  async set(req, now) {
    const ctx = req.context;
    const status = req.status;
    checkSettable(status);
    checkData(req.data_json);
    retainUntil(ctx, now); // past year 9999 before the lock is looked at, as in the model
    if (ctx.lock_token !== null) {
      // Every settable status may follow Processing, so fencing is the only check.
      const params = bind(ctx, status, req.data_json, ...stamp(ctx, now), ctx.lock_token);
      return fenced(ctx, "fencedSet", params, status, req.data_json, null);
    }
    if (NEEDS_LOCK.has(status)) {
      const { rows } = await query("liveLock", [...keyParams(ctx), now]);
      if (rows.length) throw lockHeld(ctx, micros(rows[0].locked_until));
      throw new Refusal(
        "lock_not_held",
        `set(${label(status)}) on item ${JSON.stringify(ctx.item_key)} needs the processing lock; call try_acquire_lock first`,
        { item_key: ctx.item_key, operation: `set(${label(status)})` },
      );
    }
    const statement = status === "skipped" ? "setSkipped" : "setExpired";
    const params =
      status === "skipped"
        ? bind(ctx, ctx.scope_code, req.data_json, ...stamp(ctx, now))
        : bind(ctx, req.data_json, ...stamp(ctx, now));
    for (let round = 0; round < RACE_RETRIES; round++) {
      if ((await query(statement, params)).rowCount) return null;
      const record = await currentRecord(ctx);
      refuseLiveLock(ctx, record, now);
      checkTransition(effectiveStatus(record, now), status, ctx);
      // Allowed on this read, not at the write: another writer moved the row in between.
    }
    throw lostRaces(ctx, `set(${label(status)})`);
  },

  async release_lock_as_failed(req, now) {
    const ctx = req.context;
    if (ctx.lock_token === null) {
      throw new Refusal(
        "lock_not_held",
        `release_lock_as_failed on item ${JSON.stringify(ctx.item_key)} needs the processing lock; call try_acquire_lock first`,
        { item_key: ctx.item_key, operation: "release_lock_as_failed" },
      );
    }
    const params = bind(ctx, req.error_detail, ...stamp(ctx, now), ctx.lock_token);
    return fenced(ctx, "fencedRelease", params, "failed", null, req.error_detail);
  },

  async upsert(req, now) {
    const ctx = req.context;
    checkData(req.data_json);
    if (ctx.lock_token !== null) {
      const params = bind(ctx, "processed", req.data_json, ...stamp(ctx, now), ctx.lock_token);
      return fenced(ctx, "fencedSet", params, "processed", req.data_json, null);
    }
    const params = bind(ctx, ctx.scope_code, req.data_json, ...stamp(ctx, now));
    for (let round = 0; round < RACE_RETRIES; round++) {
      const { rows } = await query("upsert", params);
      if (int(rows[0].written) > 0) return null;
      const record = await currentRecord(ctx);
      refuseLiveLock(ctx, record, now);
      const source = effectiveStatus(record, now);
      if (!ACQUIRABLE.has(source)) checkTransition(source, "superseded", ctx);
      // Takeable or supersedable on this read, not at the write: a concurrent writer moved it.
    }
    throw lostRaces(ctx, "upsert");
  },

  async reset_expired_locks(req, now) {
    return (await query("resetExpiredLocks", [now, SWEEP_ERROR_DETAIL])).rowCount;
  },

  async expire_past_retention(req, now) {
    return (await query("expirePastRetention", [now])).rowCount;
  },
};

// --- the protocol ----------------------------------------------------------------------------

let closed = false;

function answer(message) {
  process.stdout.write(JSON.stringify(message) + "\n");
}

function fail(err) {
  if (err instanceof Refusal) return err.body;
  if (err && typeof err.code === "string") {
    // A pg or network error before any statement ran (connecting, the DDL of open).
    return { kind: "store_error", message: `PostgreSQL: ${err.message}` };
  }
  return { kind: "internal", message: String(err && err.stack), type: String(err && err.name) };
}

async function run(req) {
  const now = parseInstant(req.now);
  if (req.op === "open") {
    const protocol = negotiate(req);
    await ready;
    if (WHERE.own) await claimSchema(req.store);
    return {
      protocol,
      concurrent: !SERIAL,
      name: `node postgres ${T}` + (BUG ? ` (bug: ${BUG})` : ""),
      shared_store: !WHERE.own,
      named_store: named,
    };
  }
  if (req.op === "close") {
    closed = true;
    await ready.catch(() => {});
    await finish(req.drop_store === true);
    return null;
  }
  const op = Object.prototype.hasOwnProperty.call(ops, req.op) ? ops[req.op] : null;
  if (!op) throw new Refusal("bad_request", `unknown op ${JSON.stringify(req.op)}`);
  return op(req, now);
}

function handle(line) {
  let req;
  try {
    req = JSON.parse(line);
  } catch (err) {
    process.stderr.write(`postgres.js: a request is not JSON (${err.message}); ignored\n`);
    return;
  }
  const id = req && req.id;
  const served = (SERIAL ? (queue = queue.then(() => run(req))) : run(req)).then(
    (result) => answer({ id, result: result === undefined ? null : result }),
    (err) => answer({ id, error: fail(err) }),
  );
  if (SERIAL) queue = served;
}

// Under DSM_NODE_PG_SERIAL=1, each request starts when the one before it has been answered.
let queue = Promise.resolve();

let buffered = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while (!closed && (end = buffered.indexOf("\n")) >= 0) {
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    if (line.trim()) handle(line);
  }
  if (closed) process.stdin.destroy();
});
// The harness went away without close: drop what this process created all the same.
process.stdin.on("end", () => {
  if (!closed) {
    closed = true;
    ready
      .catch(() => {})
      .then(() => finish(false))
      .catch((err) => process.stderr.write(`postgres.js: ${err.message}\n`));
  }
});
