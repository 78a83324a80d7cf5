// BrokenHandler.exe VARIANT: one of the deliberately broken handlers, behind the protocol host.
//   no_fencing | live_lock_takeover | parsed_payload   in memory
//   read_then_write_acquire                            on SQLite, on the store the harness names

using System;
using System.IO;
using Dsm.DataStateMachine.Handlers;
using Dsm.DataStateMachine.Protocol;
using Dsm.DataStateMachine.Sqlite;

namespace Dsm.Handlers.Broken
{
    public static class Program
    {
        public static int Main(string[] args)
        {
            string variant = args.Length > 0 ? args[0] : "";
            var options = new HostOptions { Name = "dotnet broken (" + variant + ")" };
            switch (variant)
            {
                case "no_fencing":
                    return DsmProtocolHost.Run(args, clock => new InMemoryDataStateMachineHandler(clock, new NoFencing()), options);
                case "live_lock_takeover":
                    return DsmProtocolHost.Run(args, clock => new InMemoryDataStateMachineHandler(clock, new LiveLockTakeover()), options);
                case "parsed_payload":
                    return DsmProtocolHost.Run(args, clock => new InMemoryDataStateMachineHandler(clock, new ParsedPayload()), options);
                case "read_then_write_acquire":
                    string directory = Environment.GetEnvironmentVariable("DSM_DOTNET_SQLITE_DIR");
                    if (string.IsNullOrEmpty(directory)) directory = Path.Combine(Path.GetTempPath(), "dsm-dotnet-sqlite");
                    return DsmProtocolHost.Run(args, (clock, storeName) => new ReadThenWriteAcquire(
                        clock, storeName != null ? SqliteStoreLocation.Named(directory, storeName) : SqliteStoreLocation.Private(directory)),
                        options);
                default:
                    Console.Error.WriteLine("BrokenHandler: give a variant: no_fencing, live_lock_takeover, parsed_payload, read_then_write_acquire");
                    return 2;
            }
        }
    }
}
