// The in-memory handler: the current record of each key and the superseded history, behind
// one lock that makes every read-decide-write atomic. For tests, and as the smallest
// complete handler a .NET reader can compare theirs with.

using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

// Nothing here awaits (the store is memory), yet every operation is async, so that a refusal
// reaches the caller in the returned task as it does from any other handler.
#pragma warning disable 1998

namespace Dsm.DataStateMachine.Handlers
{
    public class InMemoryDataStateMachineHandler : IDataStateMachineHandler
    {
        private readonly IClock clock;
        private readonly Lifecycle rules;
        private readonly object gate = new object();
        private readonly Dictionary<RecordKey, StateRecord> current = new Dictionary<RecordKey, StateRecord>();
        private readonly List<StateRecord> superseded = new List<StateRecord>();

        public InMemoryDataStateMachineHandler(IClock clock, Lifecycle rules = null)
        {
            this.clock = clock;
            this.rules = rules ?? Lifecycle.Standard;
        }

        private StateRecord Current(StateHandlerContext context)
        {
            StateRecord record;
            return current.TryGetValue(context.RecordKey, out record) ? record : null;
        }

        public async Task<bool> ExistsAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            lock (gate)
            {
                return rules.Exists(Current(context), now);
            }
        }

        public async Task<StateRecord> GetAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            lock (gate)
            {
                return Current(context);
            }
        }

        public async Task<long?> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            lock (gate)
            {
                var taken = rules.Acquire(context, Current(context), now);
                if (taken == null) return null;
                current[context.RecordKey] = taken;
                return taken.Attempt;
            }
        }

        public async Task SetAsync(StateHandlerContext context, IdempotencyStatus status, string data, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            lock (gate)
            {
                Store(context, rules.Set(context, status, data, Current(context), now));
            }
        }

        public async Task ReleaseLockAsFailedAsync(StateHandlerContext context, string errorDetail, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            lock (gate)
            {
                Store(context, rules.Release(context, errorDetail, Current(context), now));
            }
        }

        public async Task UpsertAsync(StateHandlerContext context, string data, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            lock (gate)
            {
                var outcome = rules.Upsert(context, data, Current(context), now);
                if (outcome.Superseded != null) superseded.Add(outcome.Superseded);
                Store(context, outcome.Current);
            }
        }

        public async Task<int> ResetExpiredLocksAsync(CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            lock (gate)
            {
                var swept = new List<StateRecord>();
                foreach (var record in current.Values)
                {
                    var reset = rules.ResetExpiredLock(record, now);
                    if (reset != null) swept.Add(reset);
                }
                foreach (var record in swept) current[record.Key] = record;
                return swept.Count;
            }
        }

        public async Task<int> ExpirePastRetentionAsync(CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            lock (gate)
            {
                var expired = new List<StateRecord>();
                foreach (var record in current.Values)
                {
                    var done = rules.ExpirePastRetention(record, now);
                    if (done != null) expired.Add(done);
                }
                foreach (var record in expired) current[record.Key] = record;
                int count = expired.Count;
                for (int i = 0; i < superseded.Count; i++)
                {
                    var done = rules.ExpirePastRetention(superseded[i], now);
                    if (done == null) continue;
                    superseded[i] = done;
                    count++;
                }
                return count;
            }
        }

        private void Store(StateHandlerContext context, StateRecord record)
        {
            if (record != null) current[context.RecordKey] = record;
        }
    }
}
