// The host's adapter for a handler of the seed's interface (Seed.IDataStateMachineHandler):
// the protocol's contract on the outside, the seed's calls on the inside, nothing decided
// here. The kit's tokens never reach the seed handler (it has no parameter for one), and the
// token answered for an acquisition is the attempt of the record the handler wrote, read
// back with GetAsync, so the kit can tell holders apart in its story. Nothing is fenced by
// it: a stale holder's late write reaches the handler as any other write does.

using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Dsm.DataStateMachine.Protocol
{
    internal sealed class SeedHandlerAdapter : IDataStateMachineHandler, IStoreLifecycle, IDisposable
    {
        private readonly Seed.IDataStateMachineHandler seed;
        private readonly object gate = new object();
        private readonly Dictionary<RecordKey, long> granted = new Dictionary<RecordKey, long>();

        public SeedHandlerAdapter(Seed.IDataStateMachineHandler seed)
        {
            this.seed = seed;
        }

        /// <summary>The handler the factory built, for its lifecycle.</summary>
        public object Inner
        {
            get { return seed; }
        }

        private static StateHandlerContext Tokenless(StateHandlerContext context)
        {
            return context.LockToken == null ? context : context.WithLockToken(null);
        }

        public Task<bool> ExistsAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            return seed.ExistsAsync(Tokenless(context), cancellationToken);
        }

        public Task<StateRecord> GetAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            return seed.GetAsync(Tokenless(context), cancellationToken);
        }

        public async Task<long?> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            var plain = Tokenless(context);
            if (!await seed.TryAcquireLockAsync(plain, cancellationToken).ConfigureAwait(false)) return null;
            var record = await seed.GetAsync(plain, cancellationToken).ConfigureAwait(false);
            lock (gate)
            {
                long last;
                granted.TryGetValue(context.RecordKey, out last);
                // The record's attempt when the handler keeps one; else the grants counted here.
                long token = record != null && record.Attempt > last ? record.Attempt : last + 1;
                granted[context.RecordKey] = token;
                return token;
            }
        }

        public Task SetAsync(StateHandlerContext context, IdempotencyStatus status, string data, CancellationToken cancellationToken)
        {
            return seed.SetAsync(Tokenless(context), status, data, cancellationToken);
        }

        public Task ReleaseLockAsFailedAsync(StateHandlerContext context, string errorDetail, CancellationToken cancellationToken)
        {
            return seed.ReleaseLockAsFailedAsync(Tokenless(context), errorDetail, cancellationToken);
        }

        public Task UpsertAsync(StateHandlerContext context, string data, CancellationToken cancellationToken)
        {
            return seed.UpsertAsync(Tokenless(context), data, cancellationToken);
        }

        public Task<int> ResetExpiredLocksAsync(CancellationToken cancellationToken)
        {
            return seed.ResetExpiredLocksAsync(cancellationToken);
        }

        public Task<int> ExpirePastRetentionAsync(CancellationToken cancellationToken)
        {
            return seed.ExpirePastRetentionAsync(cancellationToken);
        }

        public Task OpenAsync(CancellationToken cancellationToken)
        {
            var lifecycle = seed as IStoreLifecycle;
            return lifecycle != null ? lifecycle.OpenAsync(cancellationToken) : Task.FromResult(0);
        }

        public Task CloseAsync(bool dropStore, CancellationToken cancellationToken)
        {
            var lifecycle = seed as IStoreLifecycle;
            if (lifecycle != null) return lifecycle.CloseAsync(dropStore, cancellationToken);
            Dispose();
            return Task.FromResult(0);
        }

        public void Dispose()
        {
            var disposable = seed as IDisposable;
            if (disposable != null) disposable.Dispose();
        }
    }
}
