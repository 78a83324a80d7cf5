// The seed's handler interface, as the DataStateMachine lifecycle document gives it: acquire
// answers whether the lock was taken, and the writes carry no fencing token. A handler
// written against it runs behind DsmProtocolHost unchanged: the host detects this interface
// and adapts it (Protocol/SeedHandlerAdapter.cs), and says "shape": "seed" on open, so that
// dsm verify judges it under the seed semantics profile.

using System.Threading;
using System.Threading.Tasks;

namespace Dsm.DataStateMachine.Seed
{
    /// <summary>
    /// The seed's store interface. The context's <see cref="StateHandlerContext.LockToken"/> is
    /// always <c>null</c> here: nothing tells the handler which acquisition a write belongs to,
    /// so a holder whose lock was swept or taken over can still write when it wakes (the
    /// hazard <c>stale_holder_late_write</c> the kit reports for this interface).
    /// </summary>
    public interface IDataStateMachineHandler
    {
        /// <summary>True iff the item's current record is Processed or Skipped.</summary>
        Task<bool> ExistsAsync(StateHandlerContext context, CancellationToken cancellationToken);

        /// <summary>The item's current record, or <c>null</c>.</summary>
        Task<StateRecord> GetAsync(StateHandlerContext context, CancellationToken cancellationToken);

        /// <summary>Writes a Processing record locked until now + the lock duration; false when another worker's lock is live or the item is done.</summary>
        Task<bool> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken);

        /// <summary>Moves the item to <paramref name="status"/> and clears the lock; no token.</summary>
        Task SetAsync(StateHandlerContext context, IdempotencyStatus status, string data, CancellationToken cancellationToken);

        /// <summary>Moves the item to Failed and clears the lock; no token.</summary>
        Task ReleaseLockAsFailedAsync(StateHandlerContext context, string errorDetail, CancellationToken cancellationToken);

        /// <summary>Adds a newer Processed record for the key (the old one becomes Superseded).</summary>
        Task UpsertAsync(StateHandlerContext context, string data, CancellationToken cancellationToken);

        /// <summary>The catch-up sweep: Processing and LockedUntil &lt; now becomes Failed. Returns how many.</summary>
        Task<int> ResetExpiredLocksAsync(CancellationToken cancellationToken);

        /// <summary>The retention sweep: records past their retention become Expired. Returns how many.</summary>
        Task<int> ExpirePastRetentionAsync(CancellationToken cancellationToken);
    }
}
