// The handler contract: what a store must answer for every operation (docs/semantics.md), and
// the optional lifecycle a store with connections or files implements.

using System;
using System.Threading;
using System.Threading.Tasks;

namespace Dsm.DataStateMachine
{
    /// <summary>
    /// Where a handler reads time. Never <c>DateTime.UtcNow</c> in a handler: the kit's clock
    /// jumps and the simulator's time reach a handler only through its clock.
    /// </summary>
    public interface IClock
    {
        /// <summary>The current instant, in UTC (<see cref="DateTimeKind.Utc"/>).</summary>
        DateTime UtcNow { get; }
    }

    /// <summary>The clock of production: the machine's.</summary>
    public sealed class SystemClock : IClock
    {
        public static readonly SystemClock Instance = new SystemClock();

        public DateTime UtcNow
        {
            get { return DateTime.UtcNow; }
        }
    }

    /// <summary>A clock a test sets and moves by hand.</summary>
    public sealed class ManualClock : IClock
    {
        private long ticks;

        public ManualClock(DateTime start)
        {
            ticks = start.Ticks;
        }

        public DateTime UtcNow
        {
            get { return new DateTime(Interlocked.Read(ref ticks), DateTimeKind.Utc); }
        }

        public void Advance(TimeSpan by)
        {
            Interlocked.Add(ref ticks, by.Ticks);
        }

        /// <summary>Puts the clock at <paramref name="instant"/> (UTC), forwards or back.</summary>
        public void Set(DateTime instant)
        {
            Interlocked.Exchange(ref ticks, instant.ToUniversalTime().Ticks);
        }
    }

    /// <summary>
    /// The DataStateMachine's store: an idempotency guard and a processing lock per work item.
    /// Every operation is atomic with respect to concurrent callers, in this process and in
    /// every other process on the same store, and reads its time from the handler's clock.
    /// </summary>
    public interface IDataStateMachineHandler
    {
        /// <summary>True iff the item's current record is Processed or Skipped: the work must not be repeated.</summary>
        Task<bool> ExistsAsync(StateHandlerContext context, CancellationToken cancellationToken);

        /// <summary>The item's current record, or <c>null</c>. Reads no clock.</summary>
        Task<StateRecord> GetAsync(StateHandlerContext context, CancellationToken cancellationToken);

        /// <summary>
        /// Takes the processing lock and returns the new fencing token (the record's attempt),
        /// or <c>null</c> when the item is done or another worker's lock is live.
        /// </summary>
        Task<long?> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken);

        /// <summary>
        /// Moves the item to <paramref name="status"/> (Processed, Failed, Skipped or Expired):
        /// fenced by the context's lock token when it carries one. <paramref name="data"/> is the
        /// payload as canonical JSON text; <c>null</c> keeps the stored data.
        /// </summary>
        Task SetAsync(StateHandlerContext context, IdempotencyStatus status, string data, CancellationToken cancellationToken);

        /// <summary>Gives the item back for a retry (Processing to Failed); needs the caller's token.</summary>
        Task ReleaseLockAsFailedAsync(StateHandlerContext context, string errorDetail, CancellationToken cancellationToken);

        /// <summary>
        /// Records a (newer) Processed result: a Processed record becomes Superseded history and
        /// a new one holds <paramref name="data"/>; a missing, Failed or Expired one is acquired
        /// and completed in one step.
        /// </summary>
        Task UpsertAsync(StateHandlerContext context, string data, CancellationToken cancellationToken);

        /// <summary>The catch-up sweep: every Processing record whose lock ended before now becomes Failed. Returns how many.</summary>
        Task<int> ResetExpiredLocksAsync(CancellationToken cancellationToken);

        /// <summary>The retention sweep: every record kept past its retain-until becomes Expired, live locks excepted. Returns how many.</summary>
        Task<int> ExpirePastRetentionAsync(CancellationToken cancellationToken);
    }

    /// <summary>
    /// Optional, for a handler whose store must be prepared and released: a connection to
    /// open, tables to create, files to remove when the harness says the store is done.
    /// </summary>
    public interface IStoreLifecycle
    {
        /// <summary>Connects and creates the store if it is missing; safe to run on every start.</summary>
        Task OpenAsync(CancellationToken cancellationToken);

        /// <summary>
        /// Releases connections. <paramref name="dropStore"/>: this is the last process of a
        /// store the harness named; remove the store (its tables or files) too.
        /// </summary>
        Task CloseAsync(bool dropStore, CancellationToken cancellationToken);
    }
}
