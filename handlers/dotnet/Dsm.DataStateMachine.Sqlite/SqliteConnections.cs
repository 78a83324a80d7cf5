// The one place that knows which ADO.NET provider opens SQLite: Mono.Data.Sqlite under Mono,
// Microsoft.Data.Sqlite under .NET. Everything else talks to System.Data.Common.
//
// Two settings are deliberate, because the providers' defaults break a multi-process run:
//
// * The journal mode is named in the connection string. Mono.Data.Sqlite otherwise runs
//   "PRAGMA journal_mode=Delete" inside Open(), which needs the whole file to itself: a
//   process opening a store that peers are writing waits for them, and one that gets in
//   switches everyone out of WAL. With "Journal Mode=Wal" the pragma asks for what the
//   file already is.
// * Waits for the write lock are bounded by 5 s, both SQLite's own busy handler and the
//   provider's retry loop ("Default Timeout", 30 s by default). The harness gives a call
//   10 s; a call that waited 30 s would be reported as a hung process instead of the
//   StoreException ("database is locked") it is.

using System;
using System.Data.Common;
using System.Globalization;
#if NETCOREAPP
using Microsoft.Data.Sqlite;
#else
using Mono.Data.Sqlite;
#endif

namespace Dsm.DataStateMachine.Sqlite
{
    public static class SqliteConnections
    {
        /// <summary>How long a statement waits for another process's write lock before failing.</summary>
        public static readonly TimeSpan BusyTimeout = TimeSpan.FromSeconds(5);

        /// <summary>An open connection to the database file at <paramref name="path"/> (created if missing), in WAL mode.</summary>
        public static DbConnection Open(string path)
        {
            int seconds = (int)BusyTimeout.TotalSeconds;
#if NETCOREAPP
            var connection = new SqliteConnection(
                "Data Source=" + path + ";Default Timeout=" + seconds.ToString(CultureInfo.InvariantCulture) + ";Pooling=False");
#else
            var connection = new SqliteConnection(
                "Data Source=" + path + ";Journal Mode=Wal;Synchronous=Normal;Pooling=False;Default Timeout=" +
                seconds.ToString(CultureInfo.InvariantCulture));
#endif
            try
            {
                connection.Open();
                Execute(connection, "PRAGMA busy_timeout = " + ((long)BusyTimeout.TotalMilliseconds).ToString(CultureInfo.InvariantCulture));
#if NETCOREAPP
                Execute(connection, "PRAGMA journal_mode = WAL");
                Execute(connection, "PRAGMA synchronous = NORMAL");
#endif
                return connection;
            }
            catch
            {
                connection.Dispose();
                throw;
            }
        }

        private static void Execute(DbConnection connection, string sql)
        {
            using (var command = connection.CreateCommand())
            {
                command.CommandText = sql;
                command.ExecuteNonQuery();
            }
        }
    }
}
