// Steps of a counterexample, run against a handler in a team's own test project: each call
// is made through the contract at an instant of a ManualClock, and its answer is given back
// as the protocol's JSON (a record as `get` answers it, an error as its kind), so a test
// compares it with what the kit's reference model answered. dsm verify prints a failing run
// of a C# handler as an NUnit test written with these steps; the contract fixture of
// Dsm.DataStateMachine.Tests uses them too. Needs no test framework.

using System;
using System.Globalization;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine.Protocol;

namespace Dsm.DataStateMachine.Testing
{
    public sealed class ProtocolSteps
    {
        private readonly ManualClock clock;

        /// <summary>
        /// <paramref name="handler"/>: an <see cref="IDataStateMachineHandler"/>, or a handler of
        /// the seed's interface (adapted as the host adapts it).
        /// </summary>
        public ProtocolSteps(object handler, ManualClock clock)
        {
            if (handler == null) throw new ArgumentNullException("handler");
            this.clock = clock;
            var contract = handler as IDataStateMachineHandler;
            var seed = handler as Seed.IDataStateMachineHandler;
            if (contract == null && seed != null) contract = new SeedHandlerAdapter(seed);
            if (contract == null) throw new ArgumentException("not a DataStateMachine handler: " + handler.GetType().FullName, "handler");
            Handler = contract;
        }

        public IDataStateMachineHandler Handler { get; }

        /// <summary>Moves the clock to <paramref name="now"/> (the protocol's instant text).</summary>
        public ProtocolSteps At(string now)
        {
            DateTime instant;
            if (!Instants.TryParse(now, out instant)) throw new ArgumentException("not an instant: " + now, "now");
            clock.Set(instant);
            return this;
        }

        public static StateHandlerContext Context(
            string tenantId, string sourceAppId, int scopeId, string scopeCode, string entityId,
            string entityExecutionId, string itemEntityKey, string itemKey,
            long lockDurationMicroseconds, long? retentionMicroseconds, long? lockToken)
        {
            var retention = retentionMicroseconds.HasValue ? Instants.FromMicroseconds(retentionMicroseconds.Value) : (TimeSpan?)null;
            var config = new HandlerConfig(Instants.FromMicroseconds(lockDurationMicroseconds), retention);
            return new StateHandlerContext(tenantId, sourceAppId, scopeId, scopeCode, entityId, entityExecutionId, itemEntityKey, itemKey, config, lockToken);
        }

        public void Open()
        {
            var lifecycle = Handler as IStoreLifecycle;
            if (lifecycle != null) lifecycle.OpenAsync(CancellationToken.None).GetAwaiter().GetResult();
        }

        public void Close(bool dropStore = true)
        {
            var lifecycle = Handler as IStoreLifecycle;
            if (lifecycle != null)
            {
                lifecycle.CloseAsync(dropStore, CancellationToken.None).GetAwaiter().GetResult();
                return;
            }
            var disposable = Handler as IDisposable;
            if (disposable != null) disposable.Dispose();
        }

        public string Exists(StateHandlerContext context)
        {
            return Answer(() => Handler.ExistsAsync(context, CancellationToken.None).GetAwaiter().GetResult() ? "true" : "false");
        }

        public string Get(StateHandlerContext context)
        {
            return Answer(() =>
            {
                var into = new StringBuilder();
                Answers.Record(into, Handler.GetAsync(context, CancellationToken.None).GetAwaiter().GetResult());
                return into.ToString();
            });
        }

        public string TryAcquireLock(StateHandlerContext context)
        {
            return Answer(() => Number(Handler.TryAcquireLockAsync(context, CancellationToken.None).GetAwaiter().GetResult()));
        }

        /// <summary><paramref name="status"/> as the protocol spells it (<c>processed</c>, <c>skipped</c>...).</summary>
        public string Set(StateHandlerContext context, string status, string dataJson)
        {
            return Answer(() =>
            {
                IdempotencyStatus parsed;
                if (!Statuses.TryParseWireValue(status, out parsed)) throw new ArgumentException("not a status: " + status, "status");
                Handler.SetAsync(context, parsed, dataJson, CancellationToken.None).GetAwaiter().GetResult();
                return "null";
            });
        }

        public string ReleaseLockAsFailed(StateHandlerContext context, string errorDetail)
        {
            return Answer(() => Done(Handler.ReleaseLockAsFailedAsync(context, errorDetail, CancellationToken.None)));
        }

        public string Upsert(StateHandlerContext context, string dataJson)
        {
            return Answer(() => Done(Handler.UpsertAsync(context, dataJson, CancellationToken.None)));
        }

        public string ResetExpiredLocks()
        {
            return Answer(() => Number(Handler.ResetExpiredLocksAsync(CancellationToken.None).GetAwaiter().GetResult()));
        }

        public string ExpirePastRetention()
        {
            return Answer(() => Number(Handler.ExpirePastRetentionAsync(CancellationToken.None).GetAwaiter().GetResult()));
        }

        private static string Done(Task task)
        {
            task.GetAwaiter().GetResult();
            return "null";
        }

        private static string Number(long? value)
        {
            return value.HasValue ? value.Value.ToString(CultureInfo.InvariantCulture) : "null";
        }

        /// <summary>The call's answer: its result as JSON, or <c>{"error":"KIND"}</c>.</summary>
        private static string Answer(Func<string> call)
        {
            try
            {
                return call();
            }
            catch (ArgumentException)
            {
                throw;
            }
            catch (Exception thrown)
            {
                var error = Answers.Unwrap(thrown);
                if (error is System.Data.Common.DbException) return "{\"error\":\"store_error\"}";
                var kind = Answers.KindOf(error);
                if (kind != null) return "{\"error\":\"" + kind + "\"}";
                return "{\"error\":\"internal\",\"type\":\"" + error.GetType().Name + "\"}";
            }
        }
    }
}
