// Deliberately broken handlers: each is a mistake stores make in practice, and the kit must
// catch each one through the protocol host (tests/integration/test_dotnet_handlers.py).
// They are built for the tests only; nothing else references them.

using System;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Handlers;
using Dsm.DataStateMachine.Sqlite;
using Newtonsoft.Json;
using Newtonsoft.Json.Linq;

namespace Dsm.Handlers.Broken
{
    /// <summary>A holder's write lands whatever token the record carries: a worker that wakes after a take-over overwrites it.</summary>
    public sealed class NoFencing : Lifecycle
    {
        protected override StateRecord RequireHolder(StateHandlerContext ctx, StateRecord current)
        {
            return current ?? base.RequireHolder(ctx, current);
        }
    }

    /// <summary>Acquire takes any Processing record, its lock live or not: two workers hold one item.</summary>
    public sealed class LiveLockTakeover : Lifecycle
    {
        protected override bool MayAcquire(StateRecord current, DateTime now)
        {
            return (current != null && current.Status == IdempotencyStatus.Processing) || base.MayAcquire(current, now);
        }
    }

    /// <summary>
    /// The payload kept as a Newtonsoft JObject and written back from it: numbers become
    /// doubles, so -0.0 reads back as 0.0 (and a string that looks like a date as another
    /// text). What a handler that parses its payload into a JSON object model does.
    /// </summary>
    public sealed class ParsedPayload : Lifecycle
    {
        protected override string Stored(string data)
        {
            return JObject.Parse(data).ToString(Formatting.None);
        }
    }

    /// <summary>
    /// Acquire reads the row, decides, and writes its decision in a second transaction without
    /// reading again: atomic within its process (it holds the process's connection gate from
    /// the read to the write, as an in-process mutex around check-then-insert would), wrong
    /// across processes, where two acquires read the same free row and both write a lock.
    /// The pause stands for the round trip to a database server between the two statements.
    /// </summary>
    public sealed class ReadThenWriteAcquire : BuiltInDataStateMachineHandler
    {
        public ReadThenWriteAcquire(IClock clock, SqliteStoreLocation store) : base(clock, store) { }

        public override Task<long?> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            var now = Clock.UtcNow;
            return Serialized(async () =>
            {
                var seen = await ReadCurrentAsync(context.RecordKey, cancellationToken);
                var taken = Rules.Acquire(context, seen == null ? null : seen.Record, now);
                if (taken == null) return (long?)null;
                await Task.Delay(5, cancellationToken);
                await InWriteTransactionAsync(async () =>
                {
                    var row = await ReadCurrentAsync(context.RecordKey, cancellationToken); // only for its row id
                    await SaveCurrentAsync(context, row, taken, cancellationToken);
                    return true;
                }, cancellationToken);
                return (long?)taken.Attempt;
            }, cancellationToken);
        }
    }
}
