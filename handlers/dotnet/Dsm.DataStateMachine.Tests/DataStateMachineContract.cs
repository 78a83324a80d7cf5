// The contract as NUnit tests a team runs in its own test project: subclass
// DataStateMachineContract, build your handler in CreateHandler, and nunit-console runs the
// lifecycle's promises against it on a ManualClock. These are a handful of fixed cases, for a
// team's own build; dsm verify is what searches (races, clock jumps, processes on one store).
//
//   [TestFixture]
//   public class MyHandlerContract : DataStateMachineContract
//   {
//       protected override object CreateHandler(IClock clock) { return new MyHandler(clock); }
//   }
//
// Each test opens a fresh handler, whose store must start empty (dsm verify says so when it
// does not), and closes it, dropping the store.

using System;
using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Testing;
using NUnit.Framework;

namespace Dsm.DataStateMachine.Tests
{
    public abstract class DataStateMachineContract
    {
        protected static readonly DateTime Start = new DateTime(2026, 3, 2, 9, 0, 0, DateTimeKind.Utc);
        private const long ThirtyMinutes = 30L * 60 * 1000 * 1000;
        private const long OneDay = 24L * 60 * 60 * 1000 * 1000;

        protected ManualClock Clock { get; private set; }
        protected ProtocolSteps Steps { get; private set; }

        /// <summary>Your handler (an IDataStateMachineHandler, or one of the seed's interface), on this clock.</summary>
        protected abstract object CreateHandler(IClock clock);

        /// <summary>False for a handler of the seed's interface: its writes carry no token to fence with.</summary>
        protected virtual bool Fenced
        {
            get { return true; }
        }

        [SetUp]
        public void OpenHandler()
        {
            Clock = new ManualClock(Start);
            Steps = new ProtocolSteps(CreateHandler(Clock), Clock);
            Steps.Open();
        }

        [TearDown]
        public void CloseHandler()
        {
            if (Steps != null) Steps.Close();
        }

        protected static StateHandlerContext Item(string itemKey, string execution = "run-1", long? token = null)
        {
            return ProtocolSteps.Context("t1", "billing", 4, "Element", "invoice-dispatch", execution, "", itemKey, ThirtyMinutes, OneDay, token);
        }

        [Test]
        public void AFreshStoreHasNoRecord()
        {
            Assert.AreEqual("null", Steps.Get(Item("INV-1")), "each test case must open an empty store");
            Assert.AreEqual("false", Steps.Exists(Item("INV-1")));
        }

        [Test]
        public void TheFirstAcquireGetsTokenOneAndASecondIsRefusedWhileTheLockIsLive()
        {
            Assert.AreEqual("1", Steps.TryAcquireLock(Item("INV-1")));
            Assert.AreEqual("null", Steps.TryAcquireLock(Item("INV-1", "run-2")));
        }

        [Test]
        public void TheHoldersCompletionMakesTheItemExist()
        {
            Assert.AreEqual("1", Steps.TryAcquireLock(Item("INV-1")));
            Assert.AreEqual("null", Steps.Set(Item("INV-1", token: 1), "processed", "{\"charged\":12.5}"));
            Assert.AreEqual("true", Steps.Exists(Item("INV-1")));
            StringAssert.Contains("\"data_json\":\"{\\\"charged\\\":12.5}\"", Steps.Get(Item("INV-1")), "the payload comes back as written");
            Assert.AreEqual("null", Steps.TryAcquireLock(Item("INV-1", "run-2")), "done work is not taken again");
        }

        [Test]
        public void AFailureGivesTheItemBackForARetry()
        {
            Assert.AreEqual("1", Steps.TryAcquireLock(Item("INV-1")));
            Assert.AreEqual("null", Steps.ReleaseLockAsFailed(Item("INV-1", token: 1), "card declined"));
            Assert.AreEqual("false", Steps.Exists(Item("INV-1")));
            Assert.AreEqual("2", Steps.TryAcquireLock(Item("INV-1", "run-2")));
        }

        [Test]
        public void TheCatchUpSweepResetsOnlyExpiredLocks()
        {
            Assert.AreEqual("1", Steps.TryAcquireLock(Item("INV-1")));
            Clock.Advance(TimeSpan.FromMinutes(30));
            Assert.AreEqual("0", Steps.ResetExpiredLocks(), "a lock is live up to its expiry instant");
            Clock.Advance(TimeSpan.FromTicks(10));
            Assert.AreEqual("1", Steps.ResetExpiredLocks());
            StringAssert.Contains("\"status\":\"failed\"", Steps.Get(Item("INV-1")));
        }

        [Test]
        public void AStaleHoldersLateWriteIsRefused()
        {
            Assert.AreEqual("1", Steps.TryAcquireLock(Item("INV-1")));
            Clock.Advance(TimeSpan.FromMinutes(31));
            Assert.AreEqual("2", Steps.TryAcquireLock(Item("INV-1", "run-2")));
            string late = Steps.Set(Item("INV-1", token: 1), "processed", "{}");
            if (!Fenced)
            {
                Assert.Ignore("hazard stale_holder_late_write: the seed's writes carry no token; the late write answered " + late);
            }
            Assert.AreEqual("{\"error\":\"stale_lock\"}", late);
            StringAssert.Contains("\"status\":\"processing\",\"attempt\":2", Steps.Get(Item("INV-1")));
        }
    }
}
