// An in-memory DataStateMachine handler speaking the dsm handler protocol
// (docs/protocol.md): one JSON request per line on stdin, one JSON answer per
// line on stdout. The JDK alone, one file, no packages: build and verify with
//
//   javac -d /tmp/dsm-java handlers/java/MemoryHandler.java
//   dsm verify --exec "java -cp /tmp/dsm-java MemoryHandler" --profile dev
//
// It follows reference_engine/model.py rule for rule. Requests are served by a
// small thread pool, so answers can come back out of order; every operation
// holds the store's lock for its whole read-check-write, which is what makes it
// atomic. Instants are integer microseconds since the epoch (the kit judges
// retention 1 microsecond either side of a record's end), and payloads are kept
// as the JSON text the harness sent, never re-parsed (1.0 must stay 1.0).
//
// DSM_JAVA_BUG=no_fencing switches on a deliberately broken store: a holder's
// write lands whatever token the record carries, so a test can show the kit
// catching it through the protocol.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

public final class MemoryHandler {
    /** The protocol version this handler speaks (docs/protocol.md, Versions). */
    static final int PROTOCOL_VERSION = 2;

    /**
     * The version open is answered with: PROTOCOL_VERSION when the harness offers it (every
     * version it offers is in "protocols"; a harness that offers one says it in "protocol"
     * alone), a bad request naming what was offered otherwise.
     */
    static int negotiate(Map<String, Object> req) {
        Object list = req.containsKey("protocols")
            ? req.get("protocols")
            : java.util.Collections.singletonList(req.get("protocol"));
        List<String> offered = new ArrayList<>();
        if (list instanceof List) {
            for (Object version : (List<?>) list) offered.add(String.valueOf(version));
        }
        if (!offered.contains(String.valueOf(PROTOCOL_VERSION))) {
            throw new Refusal("bad_request", "this handler speaks protocol version " + PROTOCOL_VERSION
                + "; open offered " + String.join(", ", offered));
        }
        return PROTOCOL_VERSION;
    }
    static final int MAX_DATA_BYTES = 256 * 1024;
    static final String SWEEP_ERROR_DETAIL = "lock expired; reset by the catch-up sweep";
    /** 9999-12-31T23:59:59.999999Z in microseconds: the last instant a record can hold. */
    static final long LAST_INSTANT = 253402300799999999L;
    static final boolean NO_FENCING = "no_fencing".equals(System.getenv("DSM_JAVA_BUG"));

    // The transition table of reference_engine/status.py.
    static final Map<String, List<String>> TRANSITIONS = Map.of(
        "none", List.of("processing", "skipped"),
        "processing", List.of("processed", "failed", "skipped", "expired"),
        "processed", List.of("superseded", "skipped", "expired"),
        "failed", List.of("processing", "skipped", "expired"),
        "superseded", List.of("skipped", "expired"),
        "skipped", List.of("skipped", "expired"),
        "expired", List.of("processing", "skipped"));
    static final Set<String> COMPLETED = Set.of("processed", "skipped");
    static final Set<String> ACQUIRABLE = Set.of("none", "failed", "expired");
    static final Set<String> SETTABLE = Set.of("processed", "failed", "skipped", "expired");
    static final Set<String> NEEDS_LOCK = Set.of("processed", "failed");
    static final Object NULL = new Object() {
        @Override public String toString() { return "null"; }
    };
    static final DateTimeFormatter INSTANT =
        DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSSSSS'Z'").withZone(ZoneOffset.UTC);

    /** A refusal the protocol names by kind; fields become members of the error object. */
    static final class Refusal extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final Map<String, Object> body = new LinkedHashMap<>();

        Refusal(String kind, String message, Object... fields) {
            super(message);
            body.put("kind", kind);
            body.put("message", message);
            for (int i = 0; i < fields.length; i += 2) body.put((String) fields[i], fields[i + 1]);
        }
    }

    static final class Rec {
        Map<String, Object> key;
        String status;
        long attempt;
        Long lockedUntil;
        String dataJson;
        String errorDetail;
        String executionId;
        String sourceAppId;
        long createdAt;
        long updatedAt;
        Long retainUntil;

        /** A copy a caller may keep: the store's own record goes on changing. */
        Rec copy() {
            Rec c = new Rec();
            c.key = key;
            c.status = status;
            c.attempt = attempt;
            c.lockedUntil = lockedUntil;
            c.dataJson = dataJson;
            c.errorDetail = errorDetail;
            c.executionId = executionId;
            c.sourceAppId = sourceAppId;
            c.createdAt = createdAt;
            c.updatedAt = updatedAt;
            c.retainUntil = retainUntil;
            return c;
        }
    }

    /** The fields of a request's context this handler reads. */
    static final class Ctx {
        final String tenant, entity, itemEntityKey, itemKey, executionId, sourceAppId;
        final long scopeId, lockDuration;
        final Long retention, token;
        /** The context as the request carried it. */
        final Map<String, Object> raw;

        Ctx(Map<String, Object> raw) {
            this.raw = raw;
            tenant = (String) raw.get("tenant_id");
            scopeId = (Long) raw.get("scope_id");
            entity = (String) raw.get("entity_id");
            itemEntityKey = (String) raw.get("item_entity_key");
            itemKey = (String) raw.get("item_key");
            executionId = (String) raw.get("entity_execution_id");
            sourceAppId = (String) raw.get("source_app_id");
            lockDuration = (Long) raw.get("lock_duration_us");
            retention = raw.get("retention_us") == NULL ? null : (Long) raw.get("retention_us");
            token = raw.get("lock_token") == NULL ? null : (Long) raw.get("lock_token");
        }

        List<Object> key() { return List.of(tenant, scopeId, entity, itemEntityKey, itemKey); }

        /** The same context carrying {@code token} (null: none) as its fencing token. */
        Ctx withToken(Long token) {
            Map<String, Object> copy = new LinkedHashMap<>(raw);
            copy.put("lock_token", token == null ? NULL : token);
            return new Ctx(copy);
        }

        Map<String, Object> keyObject() {
            Map<String, Object> key = new LinkedHashMap<>();
            key.put("tenant_id", tenant);
            key.put("scope_id", scopeId);
            key.put("entity_id", entity);
            key.put("item_entity_key", itemEntityKey);
            key.put("item_key", itemKey);
            return key;
        }
    }

    // --- the store ------------------------------------------------------------------------------

    final Map<List<Object>, Rec> current = new LinkedHashMap<>();
    final List<Rec> superseded = new ArrayList<>();

    static String label(String status) {
        return Character.toUpperCase(status.charAt(0)) + status.substring(1);
    }

    static boolean isLive(Rec r, long now) {
        return r.status.equals("processing") && r.lockedUntil != null && now <= r.lockedUntil;
    }

    static String effective(Rec r, long now) {
        if (r == null) return "none";
        if (r.status.equals("processing") && !isLive(r, now)) return "failed";
        return r.status;
    }

    static void checkTransition(String source, String target, Ctx ctx) {
        if (!TRANSITIONS.get(source).contains(target)) {
            List<String> allowed = new ArrayList<>();
            for (String s : TRANSITIONS.get(source)) allowed.add(label(s));
            allowed.sort(null);
            throw new Refusal("forbidden_transition",
                "transition " + label(source) + " -> " + label(target) + " is not allowed for item "
                    + ctx.itemKey + "; allowed from " + label(source) + ": " + String.join(", ", allowed),
                "source", label(source), "target", label(target), "allowed", allowed, "item_key", ctx.itemKey);
        }
    }

    static Rec requireHolder(Ctx ctx, Rec r) {
        if (NO_FENCING && r != null) return r;
        if (r == null || !r.status.equals("processing") || r.attempt != ctx.token) {
            throw new Refusal("stale_lock",
                "stale lock on item " + ctx.itemKey + ": this execution holds fencing token " + ctx.token
                    + ", but the record is " + (r == null ? "gone" : label(r.status) + " with token " + r.attempt)
                    + "; this write is rejected",
                "item_key", ctx.itemKey, "token", ctx.token,
                "current_token", r == null ? NULL : (Object) r.attempt,
                "status", r == null ? "None" : label(r.status));
        }
        return r;
    }

    /**
     * A retried fenced write whose first copy landed: the record shows exactly what the write
     * asks for under its token (this status, unlocked, this error detail, this data or none
     * given), so the retry succeeds and changes nothing (reference_engine/model.py,
     * write_landed). Both texts are the harness's canonical JSON, so comparing them is exact.
     */
    static boolean writeLanded(Rec r, Long token, String status, String dataJson, String errorDetail) {
        if (r == null || r.attempt != token || !r.status.equals(status) || r.lockedUntil != null) return false;
        if (!Objects.equals(r.errorDetail, errorDetail)) return false;
        return dataJson == null || dataJson.equals(r.dataJson);
    }

    static void refuseLiveLock(Ctx ctx, Rec r, long now) {
        if (r != null && isLive(r, now)) {
            throw new Refusal("lock_held",
                "item " + ctx.itemKey + " is locked by another worker until " + format(r.lockedUntil),
                "item_key", ctx.itemKey, "locked_until", format(r.lockedUntil));
        }
    }

    static void checkData(Object dataJson) {
        if (dataJson == NULL) return;
        int size = ((String) dataJson).getBytes(StandardCharsets.UTF_8).length;
        if (size > MAX_DATA_BYTES) {
            throw new Refusal("payload_too_large",
                "data payload is " + size + " bytes serialised; the limit is " + MAX_DATA_BYTES + " bytes",
                "size", size, "limit", MAX_DATA_BYTES);
        }
    }

    /** A duration added to now; past the last instant it is instant_out_of_range, nothing written. */
    static long after(long now, long duration, String option) {
        long end;
        try {
            end = Math.addExact(now, duration);
        } catch (ArithmeticException overflow) {
            end = Long.MAX_VALUE;
        }
        if (end > LAST_INSTANT) {
            String at = format(now);
            String length = duration + " microseconds";
            throw new Refusal("instant_out_of_range",
                "invalid DataStateMachine option '" + option + "': now (" + at + ") + " + option + " (" + length
                    + ") is past 9999-12-31 23:59:59.999999 UTC, the last instant a record can hold; nothing was written",
                "option", option, "now", at, "duration", length);
        }
        return end;
    }

    static Long retainUntil(Ctx ctx, long now) {
        return ctx.retention == null ? null : after(now, ctx.retention, "retention");
    }

    /** Insert or update the current record; null data keeps the stored data. */
    void write(Ctx ctx, long now, Rec r, String status, Long lockedUntil, String dataJson,
               Long attempt, boolean setsError, String errorDetail) {
        if (r == null) {
            r = new Rec();
            r.key = ctx.keyObject();
            r.attempt = attempt == null ? 0 : attempt;
            r.dataJson = dataJson;
            r.errorDetail = setsError ? errorDetail : null;
            r.createdAt = now;
            current.put(ctx.key(), r);
        } else {
            if (attempt != null) r.attempt = attempt;
            if (dataJson != null) r.dataJson = dataJson;
            if (setsError) r.errorDetail = errorDetail;
        }
        r.status = status;
        r.lockedUntil = lockedUntil;
        r.executionId = ctx.executionId;
        r.sourceAppId = ctx.sourceAppId;
        r.updatedAt = now;
        r.retainUntil = retainUntil(ctx, now);
    }

    static String text(Object value) { return value == NULL ? null : (String) value; }

    synchronized Object perform(String op, Map<String, Object> req, long now) {
        switch (op) {
            case "reset_expired_locks": {
                long count = 0;
                for (Rec r : current.values()) {
                    if (r.status.equals("processing") && r.lockedUntil != null && r.lockedUntil < now) {
                        r.status = "failed";
                        r.lockedUntil = null;
                        r.errorDetail = SWEEP_ERROR_DETAIL;
                        r.updatedAt = now;
                        count++;
                    }
                }
                return count;
            }
            case "expire_past_retention": {
                long count = 0;
                List<Rec> all = new ArrayList<>(current.values());
                all.addAll(superseded);
                for (Rec r : all) {
                    if (r.retainUntil != null && r.retainUntil < now && !r.status.equals("expired") && !isLive(r, now)) {
                        r.status = "expired";
                        r.lockedUntil = null;
                        r.updatedAt = now;
                        count++;
                    }
                }
                return count;
            }
            default:
                break;
        }
        @SuppressWarnings("unchecked")
        Ctx ctx = new Ctx((Map<String, Object>) req.get("context"));
        Rec r = current.get(ctx.key());
        switch (op) {
            case "exists":
                return COMPLETED.contains(effective(r, now));
            case "get":
                return r == null ? NULL : wire(r);
            case "try_acquire_lock": {
                long lockedUntil = after(now, ctx.lockDuration, "lockDuration");
                retainUntil(ctx, now);
                String source = effective(r, now);
                if (!ACQUIRABLE.contains(source)) return NULL;
                long token = r == null ? 1 : r.attempt + 1;
                write(ctx, now, r, "processing", lockedUntil, null, token, true, null);
                return token;
            }
            case "set": {
                String status = (String) req.get("status");
                if (!SETTABLE.contains(status)) {
                    String use = status.equals("superseded") ? "upsert()" : "try_acquire_lock()";
                    throw new Refusal("unsupported_status",
                        "set() cannot write status " + label(status) + "; use " + use + " instead",
                        "status", label(status), "use", use);
                }
                checkData(req.get("data_json"));
                retainUntil(ctx, now);
                String data = text(req.get("data_json"));
                if (ctx.token != null) {
                    if (writeLanded(r, ctx.token, status, data, null)) return NULL;
                    Rec held = requireHolder(ctx, r);
                    checkTransition("processing", status, ctx);
                    write(ctx, now, held, status, null, data, null, false, null);
                    return NULL;
                }
                refuseLiveLock(ctx, r, now);
                if (NEEDS_LOCK.contains(status)) {
                    throw new Refusal("lock_not_held",
                        "set(" + label(status) + ") on item " + ctx.itemKey + " needs the processing lock",
                        "item_key", ctx.itemKey, "operation", "set(" + label(status) + ")");
                }
                checkTransition(effective(r, now), status, ctx);
                write(ctx, now, r, status, null, data, r == null ? 0L : r.attempt, false, null);
                return NULL;
            }
            case "release_lock_as_failed": {
                if (ctx.token == null) {
                    throw new Refusal("lock_not_held",
                        "release_lock_as_failed on item " + ctx.itemKey + " needs the processing lock",
                        "item_key", ctx.itemKey, "operation", "release_lock_as_failed");
                }
                retainUntil(ctx, now);
                String detail = (String) req.get("error_detail");
                if (writeLanded(r, ctx.token, "failed", null, detail)) return NULL;
                Rec held = requireHolder(ctx, r);
                write(ctx, now, held, "failed", null, null, null, true, detail);
                return NULL;
            }
            case "upsert": {
                checkData(req.get("data_json"));
                retainUntil(ctx, now);
                String data = text(req.get("data_json"));
                if (ctx.token != null) {
                    if (writeLanded(r, ctx.token, "processed", data, null)) return NULL;
                    Rec held = requireHolder(ctx, r);
                    write(ctx, now, held, "processed", null, data, null, false, null);
                    return NULL;
                }
                refuseLiveLock(ctx, r, now);
                String source = effective(r, now);
                if (ACQUIRABLE.contains(source)) {
                    // The happy path compressed: acquire and complete in one step.
                    write(ctx, now, r, "processed", null, data, r == null ? 1L : r.attempt + 1, true, null);
                    return NULL;
                }
                checkTransition(source, "superseded", ctx);
                r.status = "superseded";
                r.updatedAt = now;
                superseded.add(r);
                current.remove(ctx.key());
                write(ctx, now, null, "processed", null, data, r.attempt, false, null);
                return NULL;
            }
            default:
                throw new Refusal("bad_request", "unknown op " + op);
        }
    }

    static Map<String, Object> wire(Rec r) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("key", r.key);
        out.put("status", r.status);
        out.put("attempt", r.attempt);
        out.put("locked_until", r.lockedUntil == null ? NULL : format(r.lockedUntil));
        out.put("data_json", r.dataJson == null ? NULL : r.dataJson);
        out.put("error_detail", r.errorDetail == null ? NULL : r.errorDetail);
        out.put("entity_execution_id", r.executionId);
        out.put("source_app_id", r.sourceAppId);
        out.put("created_at", format(r.createdAt));
        out.put("updated_at", format(r.updatedAt));
        out.put("retain_until", r.retainUntil == null ? NULL : format(r.retainUntil));
        return out;
    }

    // --- time: integer microseconds -------------------------------------------------------------

    static long parseInstant(String text) {
        Instant instant = Instant.parse(text);
        return Math.addExact(Math.multiplyExact(instant.getEpochSecond(), 1_000_000L), instant.getNano() / 1000);
    }

    static String format(long micros) {
        return INSTANT.format(Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L),
            Math.floorMod(micros, 1_000_000L) * 1000L));
    }

    // --- JSON: just what the protocol needs -----------------------------------------------------

    static final class Parser {
        final String s;
        int i;

        Parser(String s) { this.s = s; }

        Object parse() {
            Object value = value();
            skip();
            if (i != s.length()) throw new IllegalArgumentException("trailing characters at " + i);
            return value;
        }

        void skip() { while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++; }

        Object value() {
            skip();
            if (i >= s.length()) throw new IllegalArgumentException("unexpected end");
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> map = new LinkedHashMap<>();
                i++;
                skip();
                if (s.charAt(i) == '}') { i++; return map; }
                while (true) {
                    skip();
                    String key = string();
                    skip();
                    expect(':');
                    map.put(key, value());
                    skip();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect('}');
                    return map;
                }
            }
            if (c == '[') {
                List<Object> list = new ArrayList<>();
                i++;
                skip();
                if (s.charAt(i) == ']') { i++; return list; }
                while (true) {
                    list.add(value());
                    skip();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect(']');
                    return list;
                }
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return NULL; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            String number = s.substring(start, i);
            if (number.isEmpty()) throw new IllegalArgumentException("unexpected character at " + start);
            if (number.matches("-?[0-9]+")) return Long.parseLong(number);
            return Double.parseDouble(number);
        }

        void expect(char c) {
            if (i >= s.length() || s.charAt(i) != c) throw new IllegalArgumentException("expected " + c + " at " + i);
            i++;
        }

        String string() {
            expect('"');
            StringBuilder out = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return out.toString();
                if (c != '\\') { out.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case '"': out.append('"'); break;
                    case '\\': out.append('\\'); break;
                    case '/': out.append('/'); break;
                    case 'b': out.append('\b'); break;
                    case 'f': out.append('\f'); break;
                    case 'n': out.append('\n'); break;
                    case 'r': out.append('\r'); break;
                    case 't': out.append('\t'); break;
                    case 'u': out.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: throw new IllegalArgumentException("bad escape \\" + e);
                }
            }
        }
    }

    static void emit(StringBuilder out, Object value) {
        if (value == null || value == NULL) {
            out.append("null");
        } else if (value instanceof String) {
            String text = (String) value;
            out.append('"');
            for (int k = 0; k < text.length(); k++) {
                char c = text.charAt(k);
                if (c == '"') out.append("\\\"");
                else if (c == '\\') out.append("\\\\");
                else if (c < 0x20 || c > 0x7e) out.append(String.format("\\u%04x", (int) c));
                else out.append(c);
            }
            out.append('"');
        } else if (value instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                if (!first) out.append(',');
                first = false;
                emit(out, entry.getKey());
                out.append(':');
                emit(out, entry.getValue());
            }
            out.append('}');
        } else if (value instanceof List) {
            out.append('[');
            boolean first = true;
            for (Object item : (List<?>) value) {
                if (!first) out.append(',');
                first = false;
                emit(out, item);
            }
            out.append(']');
        } else {
            out.append(value); // Long, Integer, Boolean
        }
    }

    // --- the protocol ---------------------------------------------------------------------------

    final PrintStream stdout = new PrintStream(System.out, false, StandardCharsets.US_ASCII);

    void answer(Object id, String member, Object value) {
        answer(stdout, id, member, value);
    }

    /** One answer line on {@code out}: {"id": ID, MEMBER: VALUE}, whole, in one write. */
    static void answer(PrintStream out, Object id, String member, Object value) {
        Map<String, Object> message = new LinkedHashMap<>();
        message.put("id", id);
        message.put(member, value);
        StringBuilder line = new StringBuilder();
        emit(line, message);
        line.append('\n');
        synchronized (out) {
            out.print(line);
            out.flush();
        }
    }

    /** A failure that is not a refusal, as the protocol's {@code internal} error. */
    static Map<String, Object> internal(RuntimeException e) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("kind", "internal");
        body.put("message", String.valueOf(e) + " " + Arrays.toString(e.getStackTrace()));
        body.put("type", e.getClass().getName());
        return body;
    }

    static Map<String, Object> parseRequest(String line) {
        try {
            Object parsed = new Parser(line).parse();
            if (parsed instanceof Map) {
                @SuppressWarnings("unchecked")
                Map<String, Object> request = (Map<String, Object>) parsed;
                return request;
            }
            System.err.println("MemoryHandler: a request is not a JSON object; ignored");
        } catch (RuntimeException e) {
            System.err.println("MemoryHandler: a request is not JSON (" + e + "); ignored");
        }
        return null;
    }

    /** Answer one request; returns true for close, after which nothing more is read. */
    boolean handle(Map<String, Object> req) {
        Object id = req.get("id");
        String op = String.valueOf(req.get("op"));
        try {
            long now = parseInstant((String) req.get("now"));
            if (op.equals("open")) {
                Map<String, Object> hello = new LinkedHashMap<>();
                hello.put("protocol", negotiate(req));
                hello.put("concurrent", Boolean.TRUE);
                hello.put("name", "java in-memory" + (NO_FENCING ? " (bug: no_fencing)" : ""));
                hello.put("shape", "contract");
                hello.put("language", "java");
                answer(id, "result", hello);
                return false;
            }
            if (op.equals("close")) {
                answer(id, "result", NULL);
                return true;
            }
            answer(id, "result", perform(op, req, now));
        } catch (Refusal refusal) {
            answer(id, "error", refusal.body);
        } catch (RuntimeException e) {
            answer(id, "error", internal(e));
        }
        return false;
    }

    public static void main(String[] args) throws Exception {
        MemoryHandler handler = new MemoryHandler();
        ExecutorService pool = Executors.newFixedThreadPool(4);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            Map<String, Object> request = parseRequest(line);
            if (request == null) continue;
            Object op = request.get("op");
            if ("open".equals(op) || "close".equals(op)) {
                // Open and close are answered in order with everything before them.
                pool.shutdown();
                pool.awaitTermination(1, TimeUnit.MINUTES);
                if (handler.handle(request)) break;
                pool = Executors.newFixedThreadPool(4);
                continue;
            }
            pool.submit(() -> handler.handle(request));
        }
        pool.shutdown();
        pool.awaitTermination(1, TimeUnit.MINUTES);
    }
}
