// The built-in handler on SQLite: one row per record in Process_StateLogs, current or
// superseded, and a partial unique index that allows one current row per key.
//
// Atomicity across processes comes from SQLite's write lock, taken before the read:
// every write runs "BEGIN IMMEDIATE; read the current row; decide (Lifecycle); write;
// COMMIT". Two processes racing for one item queue on BEGIN IMMEDIATE, and the second one
// reads what the first one wrote. The sweeps are one UPDATE each. Every instant is bound
// as fixed-width text from the handler's clock, never the database's.

using System;
using System.Collections.Generic;
using System.Data.Common;
using System.Globalization;
using System.IO;
using System.Threading;
using System.Threading.Tasks;
using Dsm.DataStateMachine.Handlers;

namespace Dsm.DataStateMachine.Sqlite
{
    public class BuiltInDataStateMachineHandler : IDataStateMachineHandler, IStoreLifecycle
    {
        public const string TableName = "Process_StateLogs";

        private static readonly string[] Schema =
        {
            "CREATE TABLE IF NOT EXISTS Process_StateLogs (" +
            " Id INTEGER PRIMARY KEY AUTOINCREMENT," +
            " TenantId TEXT NOT NULL," +
            " SourceAppId TEXT NOT NULL," +
            " ScopeId INTEGER NOT NULL," +
            " ScopeCode TEXT NOT NULL," +
            " EntityId TEXT NOT NULL," +
            " EntityExecutionId TEXT NOT NULL," +
            " ItemEntityKey TEXT NOT NULL," +
            " ItemKey TEXT NOT NULL," +
            " Status TEXT NOT NULL CHECK (Status IN ('processing', 'processed', 'failed', 'superseded', 'skipped', 'expired'))," +
            " Attempt INTEGER NOT NULL DEFAULT 0 CHECK (Attempt >= 0)," +
            " LockedUntil TEXT NULL," +
            " Data TEXT NULL," +
            " ErrorDetail TEXT NULL," +
            " Superseded INTEGER NOT NULL DEFAULT 0," +
            " CreatedAt TEXT NOT NULL," +
            " UpdatedAt TEXT NOT NULL," +
            " RetainUntil TEXT NULL)",
            "CREATE UNIQUE INDEX IF NOT EXISTS UX_Process_StateLogs_CurrentKey" +
            " ON Process_StateLogs (TenantId, ScopeId, EntityId, ItemEntityKey, ItemKey) WHERE Superseded = 0",
            "CREATE INDEX IF NOT EXISTS IX_Process_StateLogs_LockSweep" +
            " ON Process_StateLogs (LockedUntil) WHERE Status = 'processing'",
            "CREATE INDEX IF NOT EXISTS IX_Process_StateLogs_Retention ON Process_StateLogs (RetainUntil)",
        };

        private const string Columns =
            "Id, TenantId, ScopeId, EntityId, ItemEntityKey, ItemKey, Status, Attempt, LockedUntil, Data, ErrorDetail," +
            " EntityExecutionId, SourceAppId, CreatedAt, UpdatedAt, RetainUntil";

        private const string SelectCurrent =
            "SELECT " + Columns + " FROM Process_StateLogs WHERE TenantId = @tenant AND ScopeId = @scope" +
            " AND EntityId = @entity AND ItemEntityKey = @itemEntity AND ItemKey = @item AND Superseded = 0";

        private const string InsertRow =
            "INSERT INTO Process_StateLogs (TenantId, SourceAppId, ScopeId, ScopeCode, EntityId, EntityExecutionId," +
            " ItemEntityKey, ItemKey, Status, Attempt, LockedUntil, Data, ErrorDetail, Superseded, CreatedAt, UpdatedAt," +
            " RetainUntil) VALUES (@tenant, @sourceApp, @scope, @scopeCode, @entity, @execution, @itemEntity, @item," +
            " @status, @attempt, @lockedUntil, @data, @errorDetail, 0, @createdAt, @updatedAt, @retainUntil)";

        private const string UpdateRow =
            "UPDATE Process_StateLogs SET Status = @status, Attempt = @attempt, LockedUntil = @lockedUntil," +
            " Data = @data, ErrorDetail = @errorDetail, EntityExecutionId = @execution, SourceAppId = @sourceApp," +
            " UpdatedAt = @updatedAt, RetainUntil = @retainUntil WHERE Id = @id";

        private const string SupersedeRow =
            "UPDATE Process_StateLogs SET Status = 'superseded', Superseded = 1, UpdatedAt = @updatedAt WHERE Id = @id";

        private const string ResetExpiredLocks =
            "UPDATE Process_StateLogs SET Status = 'failed', LockedUntil = NULL, ErrorDetail = @detail," +
            " UpdatedAt = @now WHERE Status = 'processing' AND LockedUntil IS NOT NULL AND LockedUntil < @now";

        private const string ExpirePastRetention =
            "UPDATE Process_StateLogs SET Status = 'expired', LockedUntil = NULL, UpdatedAt = @now" +
            " WHERE RetainUntil IS NOT NULL AND RetainUntil < @now AND Status <> 'expired'" +
            " AND NOT (Status = 'processing' AND LockedUntil IS NOT NULL AND LockedUntil >= @now)";

        private readonly IClock clock;
        private readonly SqliteStoreLocation store;
        private readonly SemaphoreSlim gate = new SemaphoreSlim(1, 1);
        private DbConnection connection;
        private readonly Dictionary<string, DbCommand> commands = new Dictionary<string, DbCommand>();

        public BuiltInDataStateMachineHandler(IClock clock, SqliteStoreLocation store, Lifecycle rules = null)
        {
            this.clock = clock;
            this.store = store;
            Rules = rules ?? Lifecycle.Standard;
        }

        /// <summary>The rules every write decides with.</summary>
        protected Lifecycle Rules { get; }

        /// <summary>Where every operation reads its time.</summary>
        protected IClock Clock
        {
            get { return clock; }
        }

        /// <summary>The database file.</summary>
        public string DatabasePath
        {
            get { return store.Path; }
        }

        // --- lifecycle ------------------------------------------------------------------------

        public async Task OpenAsync(CancellationToken cancellationToken)
        {
            if (connection != null) return;
            try
            {
                store.Prepare();
            }
            catch (Exception error) when (error is IOException || error is UnauthorizedAccessException)
            {
                throw new StoreException("cannot prepare the SQLite store at " + store.Path + ": " + error.Message, error);
            }
            try
            {
                connection = SqliteConnections.Open(store.Path);
                // Table and indexes in one write transaction: a peer opening at the same
                // moment never sees the table without its unique index.
                await InWriteTransactionAsync(async () =>
                {
                    foreach (var statement in Schema)
                    {
                        await Command(statement).ExecuteNonQueryAsync(cancellationToken);
                    }
                    return true;
                }, cancellationToken);
            }
            catch (DbException error)
            {
                ReleaseConnection();
                throw Failed(error);
            }
        }

        public Task CloseAsync(bool dropStore, CancellationToken cancellationToken)
        {
            ReleaseConnection();
            if (store.RemovedOnClose || (dropStore && store.Droppable)) store.Remove();
            return Task.FromResult(0);
        }

        private void ReleaseConnection()
        {
            foreach (var command in commands.Values) command.Dispose();
            commands.Clear();
            if (connection != null) connection.Dispose();
            connection = null;
        }

        // --- reads ----------------------------------------------------------------------------

        public async Task<bool> ExistsAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            var current = await Serialized(() => ReadCurrentAsync(context.RecordKey, cancellationToken), cancellationToken);
            return Rules.Exists(current == null ? null : current.Record, now);
        }

        public async Task<StateRecord> GetAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            var current = await Serialized(() => ReadCurrentAsync(context.RecordKey, cancellationToken), cancellationToken);
            return current == null ? null : current.Record;
        }

        // --- writes ---------------------------------------------------------------------------

        public virtual Task<long?> TryAcquireLockAsync(StateHandlerContext context, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            return WriteAsync(async () =>
            {
                var current = await ReadCurrentAsync(context.RecordKey, cancellationToken);
                var taken = Rules.Acquire(context, current == null ? null : current.Record, now);
                if (taken == null) return (long?)null;
                await SaveCurrentAsync(context, current, taken, cancellationToken);
                return (long?)taken.Attempt;
            }, cancellationToken);
        }

        public Task SetAsync(StateHandlerContext context, IdempotencyStatus status, string data, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            return WriteAsync(async () =>
            {
                var current = await ReadCurrentAsync(context.RecordKey, cancellationToken);
                var next = Rules.Set(context, status, data, current == null ? null : current.Record, now);
                if (next != null) await SaveCurrentAsync(context, current, next, cancellationToken);
                return true;
            }, cancellationToken);
        }

        public Task ReleaseLockAsFailedAsync(StateHandlerContext context, string errorDetail, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            return WriteAsync(async () =>
            {
                var current = await ReadCurrentAsync(context.RecordKey, cancellationToken);
                var next = Rules.Release(context, errorDetail, current == null ? null : current.Record, now);
                if (next != null) await SaveCurrentAsync(context, current, next, cancellationToken);
                return true;
            }, cancellationToken);
        }

        public Task UpsertAsync(StateHandlerContext context, string data, CancellationToken cancellationToken)
        {
            var now = clock.UtcNow;
            return WriteAsync(async () =>
            {
                var current = await ReadCurrentAsync(context.RecordKey, cancellationToken);
                var outcome = Rules.Upsert(context, data, current == null ? null : current.Record, now);
                if (outcome.Current == null) return true;
                if (outcome.Superseded != null)
                {
                    var command = Command(SupersedeRow);
                    {
                        Bind(command, "@updatedAt", Text(outcome.Superseded.UpdatedAt));
                        Bind(command, "@id", current.Id);
                        await command.ExecuteNonQueryAsync(cancellationToken);
                    }
                    current = null; // the new record is a row of its own
                }
                await SaveCurrentAsync(context, current, outcome.Current, cancellationToken);
                return true;
            }, cancellationToken);
        }

        // --- sweeps ---------------------------------------------------------------------------

        public Task<int> ResetExpiredLocksAsync(CancellationToken cancellationToken)
        {
            var now = Text(clock.UtcNow);
            return WriteAsync(async () =>
            {
                var command = Command(ResetExpiredLocks);
                {
                    Bind(command, "@detail", Lifecycle.SweepErrorDetail);
                    Bind(command, "@now", now);
                    return await command.ExecuteNonQueryAsync(cancellationToken);
                }
            }, cancellationToken);
        }

        public Task<int> ExpirePastRetentionAsync(CancellationToken cancellationToken)
        {
            var now = Text(clock.UtcNow);
            return WriteAsync(async () =>
            {
                var command = Command(ExpirePastRetention);
                {
                    Bind(command, "@now", now);
                    return await command.ExecuteNonQueryAsync(cancellationToken);
                }
            }, cancellationToken);
        }

        // --- rows -----------------------------------------------------------------------------

        /// <summary>A current row: its record and its row id.</summary>
        protected sealed class Row
        {
            public Row(long id, StateRecord record)
            {
                Id = id;
                Record = record;
            }

            public long Id { get; }
            public StateRecord Record { get; }
        }

        /// <summary>The key's current row, or <c>null</c>. Inside a write transaction, nothing changes it until the commit.</summary>
        protected async Task<Row> ReadCurrentAsync(RecordKey key, CancellationToken cancellationToken)
        {
            var command = Command(SelectCurrent);
            {
                BindKey(command, key);
                using (var reader = await command.ExecuteReaderAsync(cancellationToken))
                {
                    if (!await reader.ReadAsync(cancellationToken)) return null;
                    var rowKey = new RecordKey(
                        reader.GetString(1), checked((int)reader.GetInt64(2)), reader.GetString(3), reader.GetString(4),
                        reader.GetString(5));
                    IdempotencyStatus status;
                    if (!Statuses.TryParseWireValue(reader.GetString(6), out status))
                    {
                        throw new StoreException("Process_StateLogs row " + reader.GetInt64(0) + " has an unknown status " +
                                                 DsmException.Echo(reader.GetString(6)));
                    }
                    var record = new StateRecord(
                        rowKey, status, reader.GetInt64(7), Instant(reader, 8), NullableText(reader, 9),
                        NullableText(reader, 10), reader.GetString(11), reader.GetString(12), Instant(reader, 13).Value,
                        Instant(reader, 14).Value, Instant(reader, 15));
                    return new Row(reader.GetInt64(0), record);
                }
            }
        }

        /// <summary>Writes <paramref name="record"/> as the key's current row: over <paramref name="current"/>, or as a new row.</summary>
        protected async Task SaveCurrentAsync(StateHandlerContext context, Row current, StateRecord record, CancellationToken cancellationToken)
        {
            var command = Command(current == null ? InsertRow : UpdateRow);
            {
                if (current == null)
                {
                    BindKey(command, record.Key);
                    Bind(command, "@scopeCode", context.ScopeCode);
                    Bind(command, "@createdAt", Text(record.CreatedAt));
                }
                else
                {
                    Bind(command, "@id", current.Id);
                }
                Bind(command, "@status", record.Status.WireValue());
                Bind(command, "@attempt", record.Attempt);
                Bind(command, "@lockedUntil", Text(record.LockedUntil));
                Bind(command, "@data", record.Data);
                Bind(command, "@errorDetail", record.ErrorDetail);
                Bind(command, "@execution", record.EntityExecutionId);
                Bind(command, "@sourceApp", record.SourceAppId);
                Bind(command, "@updatedAt", Text(record.UpdatedAt));
                Bind(command, "@retainUntil", Text(record.RetainUntil));
                await command.ExecuteNonQueryAsync(cancellationToken);
            }
        }

        /// <summary>
        /// Runs <paramref name="work"/> inside <c>BEGIN IMMEDIATE ... COMMIT</c>, so its read and
        /// its write are one step for every process on the file; rolled back if it throws.
        /// </summary>
        protected Task<T> WriteAsync<T>(Func<Task<T>> work, CancellationToken cancellationToken)
        {
            return Serialized(() => InWriteTransactionAsync(work, cancellationToken), cancellationToken);
        }

        /// <summary>The transaction of <see cref="WriteAsync{T}"/>, for a caller that holds the connection already.</summary>
        protected async Task<T> InWriteTransactionAsync<T>(Func<Task<T>> work, CancellationToken cancellationToken)
        {
            await Command("BEGIN IMMEDIATE").ExecuteNonQueryAsync(cancellationToken);
            bool committed = false;
            try
            {
                T result = await work();
                await Command("COMMIT").ExecuteNonQueryAsync(cancellationToken);
                committed = true;
                return result;
            }
            finally
            {
                if (!committed)
                {
                    Command("ROLLBACK").ExecuteNonQuery();
                }
            }
        }

        /// <summary>
        /// One operation at a time on this process's connection. Processes race each other in
        /// SQLite; inside one process the connection is not shared by two statements at once.
        /// Database failures become <see cref="StoreException"/>: the outcome is unknown.
        /// </summary>
        protected async Task<T> Serialized<T>(Func<Task<T>> operation, CancellationToken cancellationToken)
        {
            if (connection == null) throw new StoreException("the SQLite store at " + store.Path + " is not open; call OpenAsync first");
            await gate.WaitAsync(cancellationToken);
            try
            {
                return await operation();
            }
            catch (DbException error)
            {
                throw Failed(error);
            }
            finally
            {
                gate.Release();
            }
        }

        private StoreException Failed(DbException error)
        {
            return new StoreException("the SQLite store at " + store.Path + " failed: " + error.Message, error);
        }

        /// <summary>
        /// The command for <paramref name="sql"/> on this connection, each of its parameters rebound by <see cref="Bind"/>.
        /// Commands are kept for the connection's life, so each statement is prepared once
        /// rather than on every call (most of a call's cost otherwise).
        /// </summary>
        protected DbCommand Command(string sql)
        {
            DbCommand command;
            if (commands.TryGetValue(sql, out command)) return command;
            command = connection.CreateCommand();
            command.CommandText = sql;
            commands.Add(sql, command);
            return command;
        }

        protected static void BindKey(DbCommand command, RecordKey key)
        {
            Bind(command, "@tenant", key.TenantId);
            Bind(command, "@scope", (long)key.ScopeId);
            Bind(command, "@entity", key.EntityId);
            Bind(command, "@itemEntity", key.ItemEntityKey);
            Bind(command, "@item", key.ItemKey);
        }

        protected static void Bind(DbCommand command, string name, object value)
        {
            int at = command.Parameters.IndexOf(name);
            if (at >= 0)
            {
                command.Parameters[at].Value = value ?? DBNull.Value;
                return;
            }
            var parameter = command.CreateParameter();
            parameter.ParameterName = name;
            parameter.Value = value ?? DBNull.Value;
            command.Parameters.Add(parameter);
        }

        /// <summary>An instant as stored: fixed-width UTC text, so comparing the text compares the instants.</summary>
        protected static string Text(DateTime? instant)
        {
            return instant.HasValue ? Instants.Format(instant.Value) : null;
        }

        private static DateTime? Instant(DbDataReader reader, int column)
        {
            if (reader.IsDBNull(column)) return null;
            DateTime instant;
            var text = reader.GetString(column);
            if (!Instants.TryParse(text, out instant))
            {
                throw new StoreException("Process_StateLogs holds " + DsmException.Echo(text) + " where an instant belongs");
            }
            return instant;
        }

        private static string NullableText(DbDataReader reader, int column)
        {
            return reader.IsDBNull(column) ? null : reader.GetString(column);
        }
    }
}
