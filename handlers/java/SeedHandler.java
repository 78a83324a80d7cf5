// The seed's handler interface in Java: acquire answers whether the lock was taken, and the
// writes carry no fencing token. A handler written to it runs behind SeedHost unchanged: the
// host adapts it and says "shape": "seed" on open, so dsm verify judges it under the seed
// semantics profile and reports a stale holder's late write as the hazard
// stale_holder_late_write, never as a pass and never as a refusal.
//
// Contexts and records are the protocol's (MemoryHandler.Ctx, MemoryHandler.Rec); instants are
// microseconds since the epoch, read from the SeedHost.Clock the factory is given; a refusal
// is a MemoryHandler.Refusal whose kind is the protocol's error kind. The methods may block
// (a database call): the host serves requests on a small pool of threads.

interface SeedHandler {
    /** True iff the item's current record is Processed or Skipped. */
    boolean exists(MemoryHandler.Ctx context);

    /** The item's current record, or null. */
    MemoryHandler.Rec get(MemoryHandler.Ctx context);

    /** Writes a Processing record locked until now + the lock duration; false when another worker's lock is live or the item is done. */
    boolean tryAcquireLock(MemoryHandler.Ctx context);

    /** Moves the item to {@code status} (processed, failed, skipped, expired) and clears the lock; no token. */
    void set(MemoryHandler.Ctx context, String status, String dataJson);

    /** Moves the item to Failed and clears the lock; no token. */
    void releaseLockAsFailed(MemoryHandler.Ctx context, String errorDetail);

    /** Adds a newer Processed record for the key (the old one becomes Superseded). */
    void upsert(MemoryHandler.Ctx context, String dataJson);

    /** The catch-up sweep: Processing and lockedUntil &lt; now becomes Failed. Returns how many. */
    long resetExpiredLocks();

    /** The retention sweep: records past their retention become Expired. Returns how many. */
    long expirePastRetention();
}
