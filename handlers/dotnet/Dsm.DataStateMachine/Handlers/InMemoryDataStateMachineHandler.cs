// The in-memory handler: the current record of each key and the superseded history, behind
// one lock that makes every read-decide-write atomic. For tests, and as the smallest
// complete handler a .NET reader can compare theirs with.
//
// Nothing here awaits (the store is memory), so the operations return finished tasks
// instead of being async methods (whose builders Mono would JIT-compile again in every
// process the kit starts); a refusal still arrives in the returned task, as from any
// other handler.

using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Dsm.DataStateMachine.Handlers
{
    public class InMemoryDataStateMachineHandler : IDataStateMachineHandler
    {
        private static readonly Task<bool> True = Task.FromResult(true);
        private static readonly Task<bool> False = Task.FromResult(false);
        private static readonly Task<long?> NotAcquired = Task.FromResult((long?)null);

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

        public Task<bool> ExistsAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            try
            {
                var now = clock.UtcNow;
                lock (gate)
                {
                    return rules.Exists(Current(context), now) ? True : False;
                }
            }
            catch (Exception error)
            {
                return Failed<bool>(error);
            }
        }

        public Task<StateRecord> GetAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            lock (gate)
            {
                return Task.FromResult(Current(context));
            }
        }

        public Task<long?> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            try
            {
                var now = clock.UtcNow;
                lock (gate)
                {
                    var taken = rules.Acquire(context, Current(context), now);
                    if (taken == null) return NotAcquired;
                    current[context.RecordKey] = taken;
                    return Task.FromResult((long?)taken.Attempt);
                }
            }
            catch (Exception error)
            {
                return Failed<long?>(error);
            }
        }

        public Task SetAsync(StateHandlerContext context, IdempotencyStatus status, string data, CancellationToken cancellationToken)
        {
            try
            {
                var now = clock.UtcNow;
                lock (gate)
                {
                    Store(context, rules.Set(context, status, data, Current(context), now));
                }
                return True;
            }
            catch (Exception error)
            {
                return Failed<bool>(error);
            }
        }

        public Task ReleaseLockAsFailedAsync(StateHandlerContext context, string errorDetail, CancellationToken cancellationToken)
        {
            try
            {
                var now = clock.UtcNow;
                lock (gate)
                {
                    Store(context, rules.Release(context, errorDetail, Current(context), now));
                }
                return True;
            }
            catch (Exception error)
            {
                return Failed<bool>(error);
            }
        }

        public Task UpsertAsync(StateHandlerContext context, string data, CancellationToken cancellationToken)
        {
            try
            {
                var now = clock.UtcNow;
                lock (gate)
                {
                    var outcome = rules.Upsert(context, data, Current(context), now);
                    if (outcome.Superseded != null) superseded.Add(outcome.Superseded);
                    Store(context, outcome.Current);
                }
                return True;
            }
            catch (Exception error)
            {
                return Failed<bool>(error);
            }
        }

        public Task<int> ResetExpiredLocksAsync(CancellationToken cancellationToken)
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
                return Task.FromResult(swept.Count);
            }
        }

        public Task<int> ExpirePastRetentionAsync(CancellationToken cancellationToken)
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
                return Task.FromResult(count);
            }
        }

        private void Store(StateHandlerContext context, StateRecord record)
        {
            if (record != null) current[context.RecordKey] = record;
        }

        private static Task<T> Failed<T>(Exception error)
        {
            var failed = new TaskCompletionSource<T>();
            failed.SetException(error);
            return failed.Task;
        }
    }
}
