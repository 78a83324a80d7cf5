// The lifecycle of one work item's record, and the one transition table the C# side reads.
//
// The table is reference_engine/status.py's TRANSITIONS, spelled out once here; the
// integration tests compile a probe that prints it and compare it with the Python table,
// so the two cannot drift apart unnoticed.

using System;
using System.Collections.Generic;
using System.Linq;

namespace Dsm.DataStateMachine
{
    /// <summary>
    /// Lifecycle of one work item's record. <see cref="None"/> stands for "no record yet"
    /// and is never stored.
    /// </summary>
    public enum IdempotencyStatus
    {
        None = 0,
        Processing = 1,
        Processed = 2,
        Failed = 3,
        Superseded = 4,
        Skipped = 5,
        Expired = 6,
    }

    /// <summary>An immutable set of statuses (a bit per status).</summary>
    public sealed class StatusSet : IEnumerable<IdempotencyStatus>
    {
        private readonly int bits;

        public StatusSet(params IdempotencyStatus[] statuses)
        {
            foreach (var status in statuses) bits |= 1 << (int)status;
        }

        public bool Contains(IdempotencyStatus status)
        {
            return (bits & (1 << (int)status)) != 0;
        }

        public IEnumerator<IdempotencyStatus> GetEnumerator()
        {
            foreach (IdempotencyStatus status in Enum.GetValues(typeof(IdempotencyStatus)))
            {
                if (Contains(status)) yield return status;
            }
        }

        System.Collections.IEnumerator System.Collections.IEnumerable.GetEnumerator()
        {
            return GetEnumerator();
        }
    }

    /// <summary>
    /// The transition table and the status sets every handler consults, so no handler
    /// encodes "which status may follow which" on its own.
    /// </summary>
    public static class Statuses
    {
        private static readonly string[] WireValues =
        {
            "none", "processing", "processed", "failed", "superseded", "skipped", "expired",
        };

        // Indexed by status: the table every check reads (a dictionary keyed by an enum would
        // cost every process the kit starts a JIT-compiled comparer before its first answer).
        private static readonly StatusSet[] Table =
        {
            Set(IdempotencyStatus.Processing, IdempotencyStatus.Skipped),
            Set(IdempotencyStatus.Processed, IdempotencyStatus.Failed, IdempotencyStatus.Skipped, IdempotencyStatus.Expired),
            Set(IdempotencyStatus.Superseded, IdempotencyStatus.Skipped, IdempotencyStatus.Expired),
            Set(IdempotencyStatus.Processing, IdempotencyStatus.Skipped, IdempotencyStatus.Expired),
            Set(IdempotencyStatus.Skipped, IdempotencyStatus.Expired),
            Set(IdempotencyStatus.Skipped, IdempotencyStatus.Expired),
            Set(IdempotencyStatus.Processing, IdempotencyStatus.Skipped),
        };

        private static readonly string[] Labels =
        {
            "None", "Processing", "Processed", "Failed", "Superseded", "Skipped", "Expired",
        };

        /// <summary>For each status, the statuses that may follow it (the table of reference_engine/status.py).</summary>
        public static IReadOnlyDictionary<IdempotencyStatus, StatusSet> Transitions
        {
            get
            {
                var table = new Dictionary<IdempotencyStatus, StatusSet>();
                for (int i = 0; i < Table.Length; i++) table.Add((IdempotencyStatus)i, Table[i]);
                return table;
            }
        }

        /// <summary>The statuses that may follow <paramref name="source"/>.</summary>
        public static StatusSet AllowedAfter(IdempotencyStatus source)
        {
            return Table[(int)source];
        }

        /// <summary>Statuses for which <c>ExistsAsync</c> answers true: the work is done or decided against.</summary>
        public static readonly StatusSet Completed =
            Set(IdempotencyStatus.Processed, IdempotencyStatus.Skipped);

        /// <summary>
        /// Statuses <c>TryAcquireLockAsync</c> may take over (an expired, unswept lock counts
        /// as Failed, see <see cref="Lifecycle.EffectiveStatus"/>).
        /// </summary>
        public static readonly StatusSet Acquirable =
            Set(IdempotencyStatus.None, IdempotencyStatus.Failed, IdempotencyStatus.Expired);

        /// <summary>The statuses <c>SetAsync</c> may write; Processing and Superseded have their own calls.</summary>
        public static readonly StatusSet Settable =
            Set(IdempotencyStatus.Processed, IdempotencyStatus.Failed, IdempotencyStatus.Skipped, IdempotencyStatus.Expired);

        /// <summary>Targets of <c>SetAsync</c> that only the lock holder may write.</summary>
        public static readonly StatusSet NeedsLock =
            Set(IdempotencyStatus.Processed, IdempotencyStatus.Failed);

        private static StatusSet Set(params IdempotencyStatus[] statuses)
        {
            return new StatusSet(statuses);
        }

        /// <summary>The lower-case value the protocol and the stores use: "processing".</summary>
        public static string WireValue(this IdempotencyStatus status)
        {
            return WireValues[(int)status];
        }

        /// <summary>The name errors and tables show: "Processing".</summary>
        public static string Label(this IdempotencyStatus status)
        {
            return Labels[(int)status];
        }

        /// <summary>The status a wire value names, or false for text that names none.</summary>
        public static bool TryParseWireValue(string text, out IdempotencyStatus status)
        {
            int index = Array.IndexOf(WireValues, text);
            status = index < 0 ? IdempotencyStatus.None : (IdempotencyStatus)index;
            return index >= 0;
        }

        public static bool IsAllowed(IdempotencyStatus source, IdempotencyStatus target)
        {
            return Table[(int)source].Contains(target);
        }

        /// <summary>Throws <see cref="ForbiddenTransitionException"/> unless the table allows the step.</summary>
        public static void CheckTransition(IdempotencyStatus source, IdempotencyStatus target, string itemKey)
        {
            if (IsAllowed(source, target)) return;
            var allowed = Table[(int)source].Select(s => s.Label()).OrderBy(s => s, StringComparer.Ordinal).ToArray();
            throw new ForbiddenTransitionException(source.Label(), target.Label(), allowed, itemKey);
        }

        /// <summary>Checks every step of a compound operation (upsert = acquire + complete).</summary>
        public static void CheckPath(string itemKey, params IdempotencyStatus[] path)
        {
            for (int i = 0; i + 1 < path.Length; i++) CheckTransition(path[i], path[i + 1], itemKey);
        }

        /// <summary>Throws <see cref="UnsupportedStatusException"/> for a status <c>SetAsync</c> may not write.</summary>
        public static void CheckSettable(IdempotencyStatus status)
        {
            if (Settable.Contains(status)) return;
            var use = status == IdempotencyStatus.Superseded ? "upsert()" : "try_acquire_lock()";
            throw new UnsupportedStatusException(status.Label(), use);
        }
    }
}
