// Which SQLite file a handler process works in, and what happens to it on close.

using System;
using System.IO;

namespace Dsm.DataStateMachine.Sqlite
{
    public sealed class SqliteStoreLocation
    {
        /// <summary>Store files nobody has written for this long were left by killed processes and are removed.</summary>
        public static readonly TimeSpan Abandoned = TimeSpan.FromDays(1);

        private SqliteStoreLocation(string path, bool shared, bool removedOnClose, bool droppable)
        {
            Path = path;
            Shared = shared;
            RemovedOnClose = removedOnClose;
            Droppable = droppable;
        }

        /// <summary>The database file.</summary>
        public string Path { get; }
        /// <summary>Every process of this configuration reaches this file (dsm stress, a team's own database).</summary>
        public bool Shared { get; }
        /// <summary>A file of this process's own, removed when it closes.</summary>
        public bool RemovedOnClose { get; }
        /// <summary>A store the harness named: removed when the close of its last process says so.</summary>
        public bool Droppable { get; }

        /// <summary>
        /// The store the harness named: <c>DIRECTORY/NAME.sqlite3</c>, shared by every process
        /// opened with that name. Names are 1 to 40 characters of a-z, 0-9 and _, so they are
        /// safe as file names.
        /// </summary>
        public static SqliteStoreLocation Named(string directory, string name)
        {
            return new SqliteStoreLocation(System.IO.Path.Combine(directory, name + ".sqlite3"), false, false, true);
        }

        /// <summary>A database file that every process with this configuration shares, and keeps.</summary>
        public static SqliteStoreLocation SharedFile(string path)
        {
            return new SqliteStoreLocation(path, true, false, false);
        }

        /// <summary>A fresh file of this process's own, removed on close.</summary>
        public static SqliteStoreLocation Private(string directory)
        {
            var name = "own_" + Guid.NewGuid().ToString("N") + ".sqlite3";
            return new SqliteStoreLocation(System.IO.Path.Combine(directory, name), false, true, false);
        }

        /// <summary>
        /// Creates the file's directory if it is missing; for a named store, also removes the
        /// stores beside it that killed processes left behind.
        /// </summary>
        public void Prepare()
        {
            var directory = System.IO.Path.GetDirectoryName(System.IO.Path.GetFullPath(Path));
            if (string.IsNullOrEmpty(directory)) return;
            Directory.CreateDirectory(directory);
            if (Droppable) RemoveAbandoned(directory);
        }

        /// <summary>Removes the database file and its WAL and shared-memory files.</summary>
        public void Remove()
        {
            foreach (var suffix in new[] { "", "-wal", "-shm", "-journal" })
            {
                try
                {
                    File.Delete(Path + suffix);
                }
                catch (IOException)
                {
                    // Another process of the store still has it; the last one removes it.
                }
            }
        }

        private static void RemoveAbandoned(string directory)
        {
            var cutoff = DateTime.UtcNow - Abandoned; // file ages are the machine's time, not the store's
            foreach (var file in Directory.GetFiles(directory, "*.sqlite3*"))
            {
                try
                {
                    if (File.GetLastWriteTimeUtc(file) < cutoff) File.Delete(file);
                }
                catch (IOException)
                {
                }
                catch (UnauthorizedAccessException)
                {
                }
            }
        }
    }
}
