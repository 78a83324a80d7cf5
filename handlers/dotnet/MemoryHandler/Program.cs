// The in-memory handler as a protocol process: each process the harness starts is one
// empty store, so it needs no cleanup and answers no named store.
//
//   handlers/dotnet/build.sh /tmp/dsm-dotnet
//   dsm verify --exec "mono /tmp/dsm-dotnet/MemoryHandler.exe" --profile ci

using Dsm.DataStateMachine.Handlers;
using Dsm.DataStateMachine.Protocol;

namespace Dsm.Handlers.Memory
{
    public static class Program
    {
        public static int Main(string[] args)
        {
            var options = new HostOptions { Name = "dotnet in-memory" };
            return DsmProtocolHost.Run(args, clock => new InMemoryDataStateMachineHandler(clock), options);
        }
    }
}
