// A handler written against the seed's interface as it is (Seed.IDataStateMachineHandler):
// acquire answers true or false, and SetAsync, ReleaseLockAsFailedAsync and UpsertAsync carry
// no token. It keeps every promise of the seed with the same rules as the in-memory handler:
// a write on a Processing record is taken as the holder's, which is all a handler of this
// interface can do (the seed's flow writes there only after acquiring). What it cannot do is
// tell a holder whose lock was swept or taken over from the one that holds the item now.

using System;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Handlers;

namespace Dsm.Handlers.Seed
{
    public sealed class SeedMemoryHandler : Dsm.DataStateMachine.Seed.IDataStateMachineHandler
    {
        private readonly object gate = new object();
        private readonly InMemoryDataStateMachineHandler store;

        public SeedMemoryHandler(IClock clock)
        {
            store = new InMemoryDataStateMachineHandler(clock);
        }

        /// <summary>The caller as the seed sees it: the holder, when the record is Processing.</summary>
        private StateHandlerContext AsHolder(StateHandlerContext context)
        {
            var current = store.GetAsync(context, CancellationToken.None).GetAwaiter().GetResult();
            bool processing = current != null && current.Status == IdempotencyStatus.Processing;
            return context.WithLockToken(processing ? current.Attempt : (long?)null);
        }

        private static Task Run(Func<Task> write)
        {
            try
            {
                write().GetAwaiter().GetResult();
                return Task.FromResult(0);
            }
            catch (Exception error)
            {
                var failed = new TaskCompletionSource<int>();
                failed.SetException(error);
                return failed.Task;
            }
        }

        public Task<bool> ExistsAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            lock (gate) return store.ExistsAsync(context, cancellationToken);
        }

        public Task<StateRecord> GetAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            lock (gate) return store.GetAsync(context, cancellationToken);
        }

        public Task<bool> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            lock (gate)
            {
                var taken = store.TryAcquireLockAsync(context, cancellationToken);
                return taken.ContinueWith(t => t.Result != null, TaskContinuationOptions.ExecuteSynchronously);
            }
        }

        public Task SetAsync(StateHandlerContext context, IdempotencyStatus status, string data, CancellationToken cancellationToken)
        {
            lock (gate) return Run(() => store.SetAsync(AsHolder(context), status, data, cancellationToken));
        }

        public Task ReleaseLockAsFailedAsync(StateHandlerContext context, string errorDetail, CancellationToken cancellationToken)
        {
            lock (gate) return Run(() => store.ReleaseLockAsFailedAsync(AsHolder(context), errorDetail, cancellationToken));
        }

        public Task UpsertAsync(StateHandlerContext context, string data, CancellationToken cancellationToken)
        {
            lock (gate) return Run(() => store.UpsertAsync(AsHolder(context), data, cancellationToken));
        }

        public Task<int> ResetExpiredLocksAsync(CancellationToken cancellationToken)
        {
            lock (gate) return store.ResetExpiredLocksAsync(cancellationToken);
        }

        public Task<int> ExpirePastRetentionAsync(CancellationToken cancellationToken)
        {
            lock (gate) return store.ExpirePastRetentionAsync(cancellationToken);
        }
    }
}
