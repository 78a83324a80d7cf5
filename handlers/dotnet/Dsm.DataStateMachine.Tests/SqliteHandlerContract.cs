// The contract fixture on the built-in handler on SQLite: each test case opens a database
// file of its own (DSM_DOTNET_SQLITE_DIR, by default dsm-dotnet-sqlite in the temporary
// directory), created empty by OpenAsync and removed by the close.

using System;
using System.IO;
using Dsm.DataStateMachine;
using Dsm.DataStateMachine.Sqlite;
using NUnit.Framework;

namespace Dsm.DataStateMachine.Tests
{
    [TestFixture]
    public class SqliteHandlerContract : DataStateMachineContract
    {
        protected override object CreateHandler(IClock clock)
        {
            string directory = Environment.GetEnvironmentVariable("DSM_DOTNET_SQLITE_DIR");
            if (string.IsNullOrEmpty(directory)) directory = Path.Combine(Path.GetTempPath(), "dsm-dotnet-sqlite");
            return new BuiltInDataStateMachineHandler(clock, SqliteStoreLocation.Private(directory));
        }
    }
}
