// A handler of the seed's interface behind the protocol host, unchanged: the host detects the
// interface, adapts it, and tells the kit its shape, so dsm verify judges it under the seed
// semantics profile and reports the stale holder's late write as a hazard.
//
//   handlers/dotnet/build.sh /tmp/dsm-dotnet
//   dsm verify --exec "mono /tmp/dsm-dotnet/SeedHandler.exe" --profile dev

using Dsm.DataStateMachine.Protocol;

namespace Dsm.Handlers.Seed
{
    public static class Program
    {
        public static int Main(string[] args)
        {
            var options = new HostOptions { Name = "dotnet seed-interface in-memory" };
            return DsmProtocolHost.Run(args, clock => new SeedMemoryHandler(clock), options);
        }
    }
}
