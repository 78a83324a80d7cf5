// The protocol host for a handler of the seed's interface (SeedHandler), and its adapter: the
// protocol's contract on the outside, the seed's calls on the inside, nothing decided here.
// One line in a main runs a team's handler behind the handler protocol (docs/protocol.md):
//
//   public static void main(String[] args) throws Exception {
//       SeedHost.serve(clock -> new MySeedHandler(clock), "my handler");
//   }
//
// The kit's tokens never reach the seed handler (it has no parameter for one), and the token
// answered for an acquisition is the attempt of the record the handler wrote, read back with
// get() (the grants counted here when the handler keeps no attempt), as the C# host's
// Protocol/SeedHandlerAdapter.cs does. Nothing is fenced by it: a stale holder's late write
// reaches the handler as any other write does.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

public final class SeedHost {
    /** Where a handler reads time: the instant of the request it is serving, in microseconds. */
    @FunctionalInterface
    public interface Clock {
        long now();
    }

    private SeedHost() {}

    /** The adapter: a SeedHandler behind the contract's operations, by the protocol's op names. */
    static final class Adapter {
        final SeedHandler seed;
        private final Map<List<Object>, Long> granted = new HashMap<>();

        Adapter(SeedHandler seed) {
            this.seed = seed;
        }

        /** The operation's answer as the protocol's value (MemoryHandler.NULL for null). */
        Object perform(String op, Map<String, Object> req) {
            switch (op) {
                case "reset_expired_locks":
                    return seed.resetExpiredLocks();
                case "expire_past_retention":
                    return seed.expirePastRetention();
                default:
                    break;
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> raw = (Map<String, Object>) req.get("context");
            MemoryHandler.Ctx plain = new MemoryHandler.Ctx(raw).withToken(null);
            switch (op) {
                case "exists":
                    return seed.exists(plain);
                case "get": {
                    MemoryHandler.Rec r = seed.get(plain);
                    return r == null ? MemoryHandler.NULL : MemoryHandler.wire(r);
                }
                case "try_acquire_lock": {
                    if (!seed.tryAcquireLock(plain)) return MemoryHandler.NULL;
                    MemoryHandler.Rec r = seed.get(plain);
                    synchronized (granted) {
                        long last = granted.getOrDefault(plain.key(), 0L);
                        // The record's attempt when the handler keeps one; else the grants counted here.
                        long token = r != null && r.attempt > last ? r.attempt : last + 1;
                        granted.put(plain.key(), token);
                        return token;
                    }
                }
                case "set":
                    seed.set(plain, (String) req.get("status"), MemoryHandler.text(req.get("data_json")));
                    return MemoryHandler.NULL;
                case "release_lock_as_failed":
                    seed.releaseLockAsFailed(plain, (String) req.get("error_detail"));
                    return MemoryHandler.NULL;
                case "upsert":
                    seed.upsert(plain, MemoryHandler.text(req.get("data_json")));
                    return MemoryHandler.NULL;
                default:
                    throw new MemoryHandler.Refusal("bad_request", "unknown op " + op);
            }
        }
    }

    /** The instant of the request this thread serves. */
    static final ThreadLocal<Long> NOW = new ThreadLocal<>();

    static final Clock REQUEST_CLOCK = () -> {
        Long now = NOW.get();
        if (now == null) throw new IllegalStateException("clock.now() read outside a request: read it inside a handler call");
        return now;
    };

    /** Serve the handlers {@code factory} builds, one per open, on stdin and stdout. */
    public static void serve(Function<Clock, SeedHandler> factory, String name) throws Exception {
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.US_ASCII);
        Adapter[] adapter = {null};
        ExecutorService pool = Executors.newFixedThreadPool(4);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            Map<String, Object> request = MemoryHandler.parseRequest(line);
            if (request == null) continue;
            Object op = request.get("op");
            if ("open".equals(op) || "close".equals(op)) {
                // Open and close are answered in order with everything before them.
                pool.shutdown();
                pool.awaitTermination(1, TimeUnit.MINUTES);
                if ("close".equals(op)) {
                    MemoryHandler.answer(out, request.get("id"), "result", MemoryHandler.NULL);
                    return;
                }
                open(request, factory, name, adapter, out);
                pool = Executors.newFixedThreadPool(4);
                continue;
            }
            Adapter served = adapter[0];
            pool.submit(() -> handle(served, request, out));
        }
        pool.shutdown();
        pool.awaitTermination(1, TimeUnit.MINUTES);
    }

    private static void open(Map<String, Object> req, Function<Clock, SeedHandler> factory, String name,
                             Adapter[] adapter, PrintStream out) {
        Object id = req.get("id");
        try {
            int protocol = MemoryHandler.negotiate(req);
            adapter[0] = new Adapter(factory.apply(REQUEST_CLOCK));
            Map<String, Object> hello = new LinkedHashMap<>();
            hello.put("protocol", protocol);
            hello.put("concurrent", Boolean.TRUE);
            hello.put("name", name);
            // The harness picks the semantics it judges by from the shape.
            hello.put("shape", "seed");
            hello.put("language", "java");
            MemoryHandler.answer(out, id, "result", hello);
        } catch (MemoryHandler.Refusal refusal) {
            MemoryHandler.answer(out, id, "error", refusal.body);
        } catch (RuntimeException e) {
            MemoryHandler.answer(out, id, "error", MemoryHandler.internal(e));
        }
    }

    private static void handle(Adapter adapter, Map<String, Object> req, PrintStream out) {
        Object id = req.get("id");
        try {
            if (adapter == null) throw new MemoryHandler.Refusal("bad_request", req.get("op") + " before open");
            NOW.set(MemoryHandler.parseInstant((String) req.get("now")));
            MemoryHandler.answer(out, id, "result", adapter.perform(String.valueOf(req.get("op")), req));
        } catch (MemoryHandler.Refusal refusal) {
            MemoryHandler.answer(out, id, "error", refusal.body);
        } catch (RuntimeException e) {
            MemoryHandler.answer(out, id, "error", MemoryHandler.internal(e));
        } finally {
            NOW.remove();
        }
    }
}
