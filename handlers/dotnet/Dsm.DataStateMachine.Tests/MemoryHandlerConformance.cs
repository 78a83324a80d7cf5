// dsm verify on the in-memory handler's protocol host, as NUnit cases: how a team runs the
// kit from its own test project (docs/dotnet.md, "Run the kit from your NUnit project").
// MemoryHandler (its Main is one line, DsmProtocolHost.Run) is built beside this assembly:
// MemoryHandler.exe by handlers/dotnet/build.sh under Mono, MemoryHandler.dll by dotnet build.
// dsm is DSM_COMMAND, else dsm on PATH.

using System;
using Dsm.DataStateMachine.Testing;
using NUnit.Framework;

namespace Dsm.DataStateMachine.Tests
{
    [TestFixture]
    public class MemoryHandlerConformance
    {
        // dev and a fixed seed: seconds, and the same test cases every run. The bar for a
        // handler of your own is dsm's default profile, ci (leave Profile out).
        private static readonly DsmConformance Dsm = new DsmConformance(HandlerCommand()) { Profile = "dev", Seed = 0 };

        [TestCaseSource(typeof(DsmConformance), "Cases")]
        public void Property(string name)
        {
            Dsm.Check(name);
        }

        private static string HandlerCommand()
        {
            return Type.GetType("Mono.Runtime") != null ? "mono --debug MemoryHandler.exe" : "dotnet MemoryHandler.dll";
        }
    }
}
