// An in-memory handler written to the seed's interface as it is (SeedHandler): acquire answers
// true or false, and set, releaseLockAsFailed and upsert carry no token. It keeps every
// promise of the seed with the rules of MemoryHandler: a write on a Processing record is taken
// as the holder's, which is all a handler of this interface can do (the seed's flow writes
// there only after acquiring). What it cannot do is tell a holder whose lock was swept or
// taken over from the one that holds the item now. It contains no protocol code.
//
//   javac -d /tmp/dsm-java handlers/java/*.java
//   dsm verify --exec "java -cp /tmp/dsm-java SeedMemoryHandler" --profile dev

import java.util.LinkedHashMap;
import java.util.Map;

public final class SeedMemoryHandler implements SeedHandler {
    private final MemoryHandler store = new MemoryHandler();
    private final SeedHost.Clock clock;

    public SeedMemoryHandler(SeedHost.Clock clock) {
        this.clock = clock;
    }

    public static void main(String[] args) throws Exception {
        SeedHost.serve(SeedMemoryHandler::new, "java seed-interface in-memory");
    }

    /** The caller as the seed sees it: the holder, when the record is Processing. */
    private MemoryHandler.Ctx asHolder(MemoryHandler.Ctx context) {
        MemoryHandler.Rec current = store.current.get(context.key());
        boolean processing = current != null && current.status.equals("processing");
        return context.withToken(processing ? current.attempt : null);
    }

    private Object perform(String op, MemoryHandler.Ctx context, Object... fields) {
        Map<String, Object> request = new LinkedHashMap<>();
        request.put("context", context.raw);
        for (int i = 0; i < fields.length; i += 2) request.put((String) fields[i], fields[i + 1]);
        return store.perform(op, request, clock.now());
    }

    private static Object orNull(String text) {
        return text == null ? MemoryHandler.NULL : text;
    }

    @Override
    public synchronized boolean exists(MemoryHandler.Ctx context) {
        return (Boolean) perform("exists", context);
    }

    @Override
    public synchronized MemoryHandler.Rec get(MemoryHandler.Ctx context) {
        MemoryHandler.Rec current = store.current.get(context.key());
        return current == null ? null : current.copy();
    }

    @Override
    public synchronized boolean tryAcquireLock(MemoryHandler.Ctx context) {
        return perform("try_acquire_lock", context) != MemoryHandler.NULL;
    }

    @Override
    public synchronized void set(MemoryHandler.Ctx context, String status, String dataJson) {
        perform("set", asHolder(context), "status", status, "data_json", orNull(dataJson));
    }

    @Override
    public synchronized void releaseLockAsFailed(MemoryHandler.Ctx context, String errorDetail) {
        perform("release_lock_as_failed", asHolder(context), "error_detail", errorDetail);
    }

    @Override
    public synchronized void upsert(MemoryHandler.Ctx context, String dataJson) {
        perform("upsert", asHolder(context), "data_json", orNull(dataJson));
    }

    @Override
    public synchronized long resetExpiredLocks() {
        return (Long) store.perform("reset_expired_locks", Map.of(), clock.now());
    }

    @Override
    public synchronized long expirePastRetention() {
        return (Long) store.perform("expire_past_retention", Map.of(), clock.now());
    }
}
