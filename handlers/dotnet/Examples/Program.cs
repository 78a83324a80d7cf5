// InvoiceExample.exe: the invoice node's guard, walked through on both handlers.
//
// First delivery, a duplicate, a billing failure and its retry, a worker whose lock expired
// and was swept while it stalled, fenced off when it wakes. Each step states what must hold
// (charges per invoice, the record's status and token); a broken guard or handler fails a
// check, printed as FAILED, and the exit status is 1.

using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Handlers;
using Dsm.DataStateMachine.Sqlite;
using Newtonsoft.Json.Linq;

namespace Dsm.Examples
{
    /// <summary>Records every charge, so "no duplicate charge" is a count; can be told to fail the next charges.</summary>
    public sealed class FakeBillingApi : IBillingApi
    {
        private readonly List<string> charges = new List<string>();

        public int FailNext { get; set; }

        public int ChargesFor(string invoiceId)
        {
            lock (charges) return charges.Count(c => c == invoiceId);
        }

        public async Task<JObject> ChargeAsync(string invoiceId, long amount, CancellationToken cancellationToken)
        {
            await Task.Yield(); // a real API call yields: concurrent workers interleave here
            lock (charges)
            {
                if (FailNext > 0)
                {
                    FailNext--;
                    throw new InvalidOperationException("billing API unavailable while charging " + invoiceId);
                }
                charges.Add(invoiceId);
                return new JObject { { "chargeId", "ch_" + charges.Count.ToString("D4") }, { "amount", amount }, { "status", "succeeded" } };
            }
        }
    }

    public static class Program
    {
        private static int failures;

        public static int Main(string[] args)
        {
            var start = new DateTime(2026, 3, 2, 9, 0, 0, DateTimeKind.Utc);
            var memoryClock = new ManualClock(start);
            Walk("in memory", new InMemoryDataStateMachineHandler(memoryClock), memoryClock);

            var directory = Path.Combine(Path.GetTempPath(), "dsm-dotnet-invoice-" + Guid.NewGuid().ToString("N"));
            var sqliteClock = new ManualClock(start);
            var sqlite = new BuiltInDataStateMachineHandler(sqliteClock, SqliteStoreLocation.Private(directory));
            sqlite.OpenAsync(CancellationToken.None).Wait();
            try
            {
                Walk("SQLite (" + BuiltInDataStateMachineHandler.TableName + ")", sqlite, sqliteClock);
            }
            finally
            {
                sqlite.CloseAsync(true, CancellationToken.None).Wait();
                Directory.Delete(directory, true);
            }
            Console.WriteLine(failures == 0 ? "ALL CHECKS PASSED" : failures + " CHECK(S) FAILED");
            return failures == 0 ? 0 : 1;
        }

        private static void Walk(string name, IDataStateMachineHandler handler, ManualClock clock)
        {
            Console.WriteLine("== " + name);
            var billing = new FakeBillingApi();
            var node = new InvoiceDispatchExecutor(handler, billing, clock);
            var config = new HandlerConfig(TimeSpan.FromMinutes(30), TimeSpan.FromDays(30));
            Func<string, StateHandlerContext> run = execution => new StateHandlerContext(
                "tenant-1", "billing-app", 4, "Element", "invoice-dispatch", execution, "", "(node)", config);
            var none = CancellationToken.None;

            var first = node.ExecuteAsync(new InvoiceMessage("INV-1", 4200), run("run-1"), none).Result;
            Check("first delivery dispatches INV-1", !first.Skipped && billing.ChargesFor("INV-1") == 1);

            var duplicate = node.ExecuteAsync(new InvoiceMessage("INV-1", 4200), run("run-2"), none).Result;
            Check("a duplicate delivery is skipped, no second charge", duplicate.Skipped && billing.ChargesFor("INV-1") == 1);

            billing.FailNext = 1;
            bool threw = false;
            try
            {
                node.ExecuteAsync(new InvoiceMessage("INV-2", 990), run("run-3"), none).Wait();
            }
            catch (AggregateException)
            {
                threw = true;
            }
            var failed = handler.GetAsync(run("run-3").ForItem("INV-2"), none).Result;
            Check("a failed charge releases the lock as Failed", threw && failed.Status == IdempotencyStatus.Failed
                && failed.LockedUntil == null && billing.ChargesFor("INV-2") == 0);
            var retried = node.ExecuteAsync(new InvoiceMessage("INV-2", 990), run("run-4"), none).Result;
            var done = handler.GetAsync(run("run-4").ForItem("INV-2"), none).Result;
            Check("the redelivery retries and charges once", !retried.Skipped && billing.ChargesFor("INV-2") == 1
                && done.Status == IdempotencyStatus.Processed && done.Attempt == 2);

            // A worker takes INV-3 and stalls past its lock; the catch-up sweep resets the lock.
            var stalled = run("run-5").ForItem("INV-3");
            long? stalledToken = handler.TryAcquireLockAsync(stalled, none).Result;
            clock.Advance(TimeSpan.FromMinutes(31));
            int swept = handler.ResetExpiredLocksAsync(none).Result;
            Check("the sweep resets the stalled worker's expired lock", stalledToken == 1 && swept == 1);
            var redelivered = node.ExecuteAsync(new InvoiceMessage("INV-3", 1500), run("run-6"), none).Result;
            Check("a redelivery takes the item over and dispatches it", !redelivered.Skipped && billing.ChargesFor("INV-3") == 1);
            bool fenced = false;
            try
            {
                handler.SetAsync(stalled.WithLockToken(stalledToken), IdempotencyStatus.Processed, "{\"late\":true}", none).Wait();
            }
            catch (AggregateException error)
            {
                fenced = error.InnerException is StaleLockException;
            }
            var kept = handler.GetAsync(stalled, none).Result;
            Check("the stalled worker's late write is fenced off", fenced && kept.Attempt == 2
                && kept.EntityExecutionId == "run-6" && !kept.Data.Contains("late"));
        }

        private static void Check(string what, bool holds)
        {
            Console.WriteLine((holds ? "  ok      " : "  FAILED  ") + what);
            if (!holds) failures++;
        }
    }
}
