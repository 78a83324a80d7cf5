// The built-in handler on SQLite as a protocol process.
//
//   handlers/dotnet/build.sh /tmp/dsm-dotnet
//   dsm verify --exec "mono /tmp/dsm-dotnet/SqliteHandler.exe" --profile ci
//
// Where its store is:
// * a store the harness names on open (the kit and the simulator name one per test case or
//   run): DSM_DOTNET_SQLITE_DIR/NAME.sqlite3, shared by every process opened with that name
//   (so the kit races its workers through several processes), removed by the last close;
// * otherwise DSM_DOTNET_SQLITE_PATH, or the SQLite file of DSM_STRESS_DB_URL under
//   dsm stress: one file every process of this configuration shares, kept;
// * otherwise a file of the process's own, removed on close.
// DSM_DOTNET_SQLITE_DIR defaults to dsm-dotnet-sqlite under the system's temporary directory.

using System;
using System.IO;
using Dsm.DataStateMachine.Protocol;
using Dsm.DataStateMachine.Sqlite;

namespace Dsm.Handlers.Sqlite
{
    public static class Program
    {
        public static int Main(string[] args)
        {
            string directory = Environment.GetEnvironmentVariable("DSM_DOTNET_SQLITE_DIR");
            if (string.IsNullOrEmpty(directory)) directory = Path.Combine(Path.GetTempPath(), "dsm-dotnet-sqlite");
            string shared = SharedPath();
            var options = new HostOptions { Name = "dotnet sqlite (Process_StateLogs)", SharedStore = shared != null };
            return DsmProtocolHost.Run(args, (clock, storeName) =>
            {
                var location = storeName != null ? SqliteStoreLocation.Named(directory, storeName)
                    : shared != null ? SqliteStoreLocation.SharedFile(shared)
                    : SqliteStoreLocation.Private(directory);
                return new BuiltInDataStateMachineHandler(clock, location);
            }, options);
        }

        /// <summary>The database file every process of this configuration shares, or null.</summary>
        private static string SharedPath()
        {
            string path = Environment.GetEnvironmentVariable("DSM_DOTNET_SQLITE_PATH");
            if (!string.IsNullOrEmpty(path)) return path;
            // dsm stress names its run's database as a SQLAlchemy URL: sqlite+aiosqlite:///PATH.
            string url = Environment.GetEnvironmentVariable("DSM_STRESS_DB_URL") ?? "";
            int at = url.IndexOf(":///", StringComparison.Ordinal);
            if (url.StartsWith("sqlite", StringComparison.Ordinal) && at > 0) return url.Substring(at + 4);
            return null;
        }
    }
}
