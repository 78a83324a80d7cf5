// Steps of a counterexample, run against a handler in a team's own tests: each call is made
// through the contract at an instant of a ManualClock, and its answer is compared with what
// the kit's reference model answered, as the protocol's values (a record as `get` answers it,
// a token, a count, null, or {"error": KIND} for a refusal). dsm verify prints a failing run
// of a Java handler as a class with a main written with these steps; expect() throws
// AssertionError at the first step that parts. The JDK alone, no test framework.

import java.util.Map;

final class ProtocolSteps {
    /** A clock the test moves: now() is microseconds since the epoch, as the host's clock gives it. */
    static final class ManualClock implements SeedHost.Clock {
        private volatile long instant;

        ManualClock(String now) {
            set(now);
        }

        @Override
        public long now() {
            return instant;
        }

        /** Move to {@code now}, the protocol's instant text. */
        void set(String now) {
            instant = MemoryHandler.parseInstant(now);
        }
    }

    /** One operation through the contract at an instant: its answer as the protocol's value. */
    @FunctionalInterface
    private interface Contract {
        Object perform(String op, Map<String, Object> request, long now);
    }

    private final Contract contract;
    private final ManualClock clock;

    /**
     * {@code handler}: a handler of the seed's interface (adapted as SeedHost adapts it, so the
     * kit's tokens never reach it), or a MemoryHandler (the contract).
     */
    ProtocolSteps(Object handler, ManualClock clock) {
        this.clock = clock;
        if (handler instanceof SeedHandler) {
            SeedHost.Adapter adapter = new SeedHost.Adapter((SeedHandler) handler);
            contract = (op, request, now) -> {
                SeedHost.NOW.set(now);
                try {
                    return adapter.perform(op, request);
                } finally {
                    SeedHost.NOW.remove();
                }
            };
        } else if (handler instanceof MemoryHandler) {
            contract = ((MemoryHandler) handler)::perform;
        } else {
            throw new IllegalArgumentException("not a DataStateMachine handler: "
                + (handler == null ? "null" : handler.getClass().getName()));
        }
    }

    /** Move the clock to {@code now}; the next call is made there. */
    ProtocolSteps at(String now) {
        clock.set(now);
        return this;
    }

    /** A request's context from its JSON text, as the protocol carries it. */
    static Map<String, Object> context(String json) {
        @SuppressWarnings("unchecked")
        Map<String, Object> context = (Map<String, Object>) new MemoryHandler.Parser(json).parse();
        return context;
    }

    Object exists(Map<String, Object> context) {
        return call("exists", "context", context);
    }

    Object get(Map<String, Object> context) {
        return call("get", "context", context);
    }

    Object tryAcquireLock(Map<String, Object> context) {
        return call("try_acquire_lock", "context", context);
    }

    /** {@code status} as the protocol spells it (processed, skipped...). */
    Object set(Map<String, Object> context, String status, String dataJson) {
        return call("set", "context", context, "status", status, "data_json", orNull(dataJson));
    }

    Object releaseLockAsFailed(Map<String, Object> context, String errorDetail) {
        return call("release_lock_as_failed", "context", context, "error_detail", errorDetail);
    }

    Object upsert(Map<String, Object> context, String dataJson) {
        return call("upsert", "context", context, "data_json", orNull(dataJson));
    }

    Object resetExpiredLocks() {
        return call("reset_expired_locks");
    }

    Object expirePastRetention() {
        return call("expire_past_retention");
    }

    /** Throws AssertionError, naming the step, unless {@code answer} is the JSON {@code expected}. */
    static void expect(String expected, Object answer, String step) {
        Object want = new MemoryHandler.Parser(expected).parse();
        if (!want.equals(answer)) {
            StringBuilder got = new StringBuilder();
            MemoryHandler.emit(got, answer);
            throw new AssertionError(step + ": expected " + expected + ", got " + got);
        }
    }

    private static Object orNull(String text) {
        return text == null ? MemoryHandler.NULL : text;
    }

    /** The call's answer: its result, or {"error": KIND}; never throws a refusal. */
    private Object call(String op, Object... fields) {
        Map<String, Object> request = new java.util.LinkedHashMap<>();
        for (int i = 0; i < fields.length; i += 2) request.put((String) fields[i], fields[i + 1]);
        try {
            return contract.perform(op, request, clock.now());
        } catch (MemoryHandler.Refusal refusal) {
            return Map.of("error", refusal.body.get("kind"));
        } catch (RuntimeException e) {
            return Map.of("error", "internal");
        }
    }
}
