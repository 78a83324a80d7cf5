// The contract fixture run against the handlers of this repository: how a team subclasses it.

using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Handlers;
using NUnit.Framework;

namespace Dsm.DataStateMachine.Tests
{
    [TestFixture]
    public class InMemoryHandlerContract : DataStateMachineContract
    {
        protected override object CreateHandler(IClock clock)
        {
            return new InMemoryDataStateMachineHandler(clock);
        }
    }
}
