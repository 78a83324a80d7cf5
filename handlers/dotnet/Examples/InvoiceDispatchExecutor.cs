// The invoice dispatcher of the lifecycle document, in C#, written against the handler
// interface alone: the guard a node around a side effect needs (reference_engine/nodes/invoice.py).
//
//   exists?            yes -> skip
//   try acquire lock?  no  -> skip (done meanwhile, or someone else is on it)
//   charge the card    throws -> release the lock as Failed (nothing was charged), rethrow
//   set Processed      store error -> read back, retry with the token still held; never release

using System;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine;
using Newtonsoft.Json.Linq;

namespace Dsm.Examples
{
    /// <summary>An invoice to dispatch: the message a node receives (redelivered any number of times).</summary>
    public sealed class InvoiceMessage
    {
        public InvoiceMessage(string invoiceId, long amount)
        {
            InvoiceId = invoiceId;
            Amount = amount;
        }

        public string InvoiceId { get; }
        /// <summary>In cents.</summary>
        public long Amount { get; }
    }

    /// <summary>The billing API: a real one charges a card; a charge made twice is a double charge.</summary>
    public interface IBillingApi
    {
        /// <summary>Charges the invoice and returns the API's response as a JSON object.</summary>
        Task<JObject> ChargeAsync(string invoiceId, long amount, CancellationToken cancellationToken);
    }

    public sealed class NodeExecutionResult
    {
        private NodeExecutionResult(bool skipped, string reason, string output)
        {
            Skipped = skipped;
            Reason = reason;
            Output = output;
        }

        public bool Skipped { get; }
        public string Reason { get; }
        /// <summary>What the node hands to the next one (JSON), when it did its work.</summary>
        public string Output { get; }

        public static NodeExecutionResult Skip(string reason)
        {
            return new NodeExecutionResult(true, reason, null);
        }

        public static NodeExecutionResult Success(string output)
        {
            return new NodeExecutionResult(false, null, output);
        }
    }

    /// <summary>Dispatches an invoice exactly once per invoice id, whatever the redeliveries.</summary>
    public sealed class InvoiceDispatchExecutor
    {
        /// <summary>How often a completed charge is recorded before the lock is left to expire (a store failing this often is down).</summary>
        public const int CompleteAttempts = 3;

        private readonly IDataStateMachineHandler dsm;
        private readonly IBillingApi billing;
        private readonly IClock clock;

        public InvoiceDispatchExecutor(IDataStateMachineHandler dsm, IBillingApi billing, IClock clock)
        {
            this.dsm = dsm;
            this.billing = billing;
            this.clock = clock;
        }

        /// <param name="node">The node execution's context (tenant, scope, entity, run, options), for no item yet.</param>
        public async Task<NodeExecutionResult> ExecuteAsync(InvoiceMessage message, StateHandlerContext node, CancellationToken cancellationToken)
        {
            var item = node.ForItem(message.InvoiceId);
            if (await dsm.ExistsAsync(item, cancellationToken))
            {
                return NodeExecutionResult.Skip("invoice " + message.InvoiceId + " already dispatched");
            }
            long? token = await dsm.TryAcquireLockAsync(item, cancellationToken);
            if (token == null)
            {
                return NodeExecutionResult.Skip("invoice " + message.InvoiceId + " is being dispatched by another worker");
            }
            // Every write from here on carries the token: a worker whose lock was swept or taken
            // over is fenced off (StaleLockException) instead of overwriting the new holder's record.
            var held = item.WithLockToken(token);
            JObject response;
            try
            {
                response = await billing.ChargeAsync(message.InvoiceId, message.Amount, cancellationToken);
            }
            catch (Exception error)
            {
                // Nothing was charged: give the item back so a redelivery can retry it.
                await dsm.ReleaseLockAsFailedAsync(held, error.GetType().Name + ": " + error.Message, cancellationToken);
                throw;
            }
            // The charge happened. Releasing the lock now would invite a second charge on
            // redelivery, so a store error is retried with the token still held, and if the
            // store stays down the lock is left to expire and the catch-up sweep takes over.
            var data = new JObject
            {
                { "dispatchedAt", Instants.Format(clock.UtcNow) },
                { "response", response },
            }.ToString(Newtonsoft.Json.Formatting.None);
            await RecordDispatchAsync(held, data, cancellationToken);
            return NodeExecutionResult.Success(new JObject { { "invoiceId", message.InvoiceId }, { "response", response } }
                .ToString(Newtonsoft.Json.Formatting.None));
        }

        /// <summary>
        /// <c>SetAsync(Processed)</c> after the charge, retried on store errors. A store error
        /// leaves the outcome unknown (the write may have landed), so the record is read back
        /// first: if it holds this dispatch, the work is recorded. A fenced write is final.
        /// </summary>
        private async Task RecordDispatchAsync(StateHandlerContext held, string data, CancellationToken cancellationToken)
        {
            for (int attempt = 1; attempt <= CompleteAttempts; attempt++)
            {
                try
                {
                    await dsm.SetAsync(held, IdempotencyStatus.Processed, data, cancellationToken);
                    return;
                }
                catch (StoreException)
                {
                    if (attempt == CompleteAttempts) throw;
                }
                StateRecord record;
                try
                {
                    record = await dsm.GetAsync(held, cancellationToken);
                }
                catch (StoreException)
                {
                    continue;
                }
                if (record != null && record.Status == IdempotencyStatus.Processed && record.Data == data) return;
            }
        }
    }
}
