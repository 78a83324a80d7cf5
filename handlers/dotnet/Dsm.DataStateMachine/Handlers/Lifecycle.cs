// The rules every operation follows, as pure decisions over the current record: what the new
// record is, or which error the call raises. reference_engine/model.py, rule for rule.
//
// Both handlers here decide with these and differ only in where the record lives and what
// makes the read-decide-write atomic: a lock around a dictionary in memory, BEGIN IMMEDIATE
// on SQLite. A handler of your own can decide with them too, inside its own transaction.
//
// The protected virtual members are the places a store goes wrong in practice; the broken
// variants (handlers/dotnet/Broken) override them to show the kit catching each one.

using System;
using System.Collections.Generic;
using System.Text;

namespace Dsm.DataStateMachine.Handlers
{
    /// <summary>What an upsert writes: the old record as Superseded history (or none), and the current one.</summary>
    public sealed class UpsertOutcome
    {
        public UpsertOutcome(StateRecord superseded, StateRecord current)
        {
            Superseded = superseded;
            Current = current;
        }

        /// <summary>The former current record, now Superseded history; <c>null</c> when the current record was updated in place.</summary>
        public StateRecord Superseded { get; }
        /// <summary>The record to store as current; <c>null</c> when the call is a retry of a write that landed (nothing to write).</summary>
        public StateRecord Current { get; }
    }

    public class Lifecycle
    {
        /// <summary>The rules of docs/semantics.md.</summary>
        public static readonly Lifecycle Standard = new Lifecycle();

        /// <summary>Payloads are at most this many bytes of UTF-8 JSON.</summary>
        public const int MaxDataBytes = 256 * 1024;

        /// <summary>The error detail the catch-up sweep writes, so a swept lock is told from a reported failure.</summary>
        public const string SweepErrorDetail = "lock expired; reset by the catch-up sweep";

        /// <summary>A lock is live while <c>now &lt;= LockedUntil</c>: the boundary instant is still live.</summary>
        public static bool IsLive(StateRecord record, DateTime now)
        {
            return record != null && record.Status == IdempotencyStatus.Processing && record.LockedUntil.HasValue
                && now <= record.LockedUntil.Value;
        }

        /// <summary>The status an operation acts on: an expired, unswept lock counts as Failed.</summary>
        public static IdempotencyStatus EffectiveStatus(StateRecord record, DateTime now)
        {
            if (record == null) return IdempotencyStatus.None;
            if (record.Status == IdempotencyStatus.Processing && !IsLive(record, now)) return IdempotencyStatus.Failed;
            return record.Status;
        }

        public virtual bool Exists(StateRecord current, DateTime now)
        {
            return Statuses.Completed.Contains(EffectiveStatus(current, now));
        }

        /// <summary>The record after a successful acquisition, or <c>null</c> when the item cannot be taken.</summary>
        public virtual StateRecord Acquire(StateHandlerContext ctx, StateRecord current, DateTime now)
        {
            var lockedUntil = ctx.HandlerConfig.LockedUntil(now);
            ctx.HandlerConfig.RetainUntil(now); // an instant past year 9999 is refused before anything else
            if (!MayAcquire(current, now)) return null;
            long token = current == null ? 1 : current.Attempt + 1;
            return Write(ctx, now, current, IdempotencyStatus.Processing, lockedUntil, null, token, true, null);
        }

        /// <summary>The record after <c>SetAsync</c>, or <c>null</c> when it is a retry of a write that landed.</summary>
        public virtual StateRecord Set(StateHandlerContext ctx, IdempotencyStatus status, string data, StateRecord current, DateTime now)
        {
            Statuses.CheckSettable(status);
            CheckData(data);
            ctx.HandlerConfig.RetainUntil(now);
            if (ctx.LockToken.HasValue)
            {
                if (WriteLanded(current, ctx.LockToken.Value, status, data, null)) return null;
                var held = RequireHolder(ctx, current);
                Statuses.CheckTransition(IdempotencyStatus.Processing, status, ctx.ItemKey);
                return Write(ctx, now, held, status, null, data, null, false, null);
            }
            RefuseLiveLock(ctx, current, now);
            if (Statuses.NeedsLock.Contains(status))
            {
                throw new LockNotHeldException(ctx.ItemKey, "set(" + status.Label() + ")");
            }
            Statuses.CheckTransition(EffectiveStatus(current, now), status, ctx.ItemKey);
            return Write(ctx, now, current, status, null, data, current == null ? 0 : current.Attempt, false, null);
        }

        /// <summary>The record after <c>ReleaseLockAsFailedAsync</c>, or <c>null</c> for a retry of a release that landed.</summary>
        public virtual StateRecord Release(StateHandlerContext ctx, string errorDetail, StateRecord current, DateTime now)
        {
            if (!ctx.LockToken.HasValue) throw new LockNotHeldException(ctx.ItemKey, "release_lock_as_failed");
            ctx.HandlerConfig.RetainUntil(now);
            if (WriteLanded(current, ctx.LockToken.Value, IdempotencyStatus.Failed, null, errorDetail)) return null;
            var held = RequireHolder(ctx, current);
            Statuses.CheckTransition(IdempotencyStatus.Processing, IdempotencyStatus.Failed, ctx.ItemKey);
            return Write(ctx, now, held, IdempotencyStatus.Failed, null, null, null, true, errorDetail);
        }

        public virtual UpsertOutcome Upsert(StateHandlerContext ctx, string data, StateRecord current, DateTime now)
        {
            CheckData(data);
            ctx.HandlerConfig.RetainUntil(now);
            if (ctx.LockToken.HasValue)
            {
                if (WriteLanded(current, ctx.LockToken.Value, IdempotencyStatus.Processed, data, null))
                {
                    return new UpsertOutcome(null, null);
                }
                var held = RequireHolder(ctx, current);
                Statuses.CheckTransition(IdempotencyStatus.Processing, IdempotencyStatus.Processed, ctx.ItemKey);
                return new UpsertOutcome(null, Write(ctx, now, held, IdempotencyStatus.Processed, null, data, null, false, null));
            }
            RefuseLiveLock(ctx, current, now);
            var source = EffectiveStatus(current, now);
            if (Statuses.Acquirable.Contains(source))
            {
                // The happy path compressed: acquire and complete in one step. Data null keeps the stored data.
                Statuses.CheckPath(ctx.ItemKey, source, IdempotencyStatus.Processing, IdempotencyStatus.Processed);
                long attempt = current == null ? 1 : current.Attempt + 1;
                return new UpsertOutcome(
                    null, Write(ctx, now, current, IdempotencyStatus.Processed, null, data, attempt, true, null));
            }
            Statuses.CheckTransition(source, IdempotencyStatus.Superseded, ctx.ItemKey);
            // The old record becomes history; the new one is a fresh record (created now, no error
            // detail, only the data given: null means none) carrying the same attempt.
            var history = current.Marked(IdempotencyStatus.Superseded, now, current.ErrorDetail);
            return new UpsertOutcome(
                history, Write(ctx, now, null, IdempotencyStatus.Processed, null, data, current.Attempt, false, null));
        }

        /// <summary>The record after the catch-up sweep, or <c>null</c> when the sweep leaves it alone.</summary>
        public virtual StateRecord ResetExpiredLock(StateRecord record, DateTime now)
        {
            if (record.Status != IdempotencyStatus.Processing || !record.LockedUntil.HasValue || !(record.LockedUntil.Value < now))
            {
                return null;
            }
            return record.Marked(IdempotencyStatus.Failed, now, SweepErrorDetail);
        }

        /// <summary>The record after the retention sweep, or <c>null</c> when the sweep leaves it alone.</summary>
        public virtual StateRecord ExpirePastRetention(StateRecord record, DateTime now)
        {
            if (!record.RetainUntil.HasValue || !(record.RetainUntil.Value < now) || record.Status == IdempotencyStatus.Expired
                || IsLive(record, now))
            {
                return null;
            }
            return record.Marked(IdempotencyStatus.Expired, now, record.ErrorDetail);
        }

        // --- the checks -----------------------------------------------------------------------

        /// <summary>Whether an acquisition may take the item now: missing, Failed, Expired, or an expired lock.</summary>
        protected virtual bool MayAcquire(StateRecord current, DateTime now)
        {
            return Statuses.Acquirable.Contains(EffectiveStatus(current, now));
        }

        /// <summary>Fencing: a write is the holder's only if the record is still Processing with its token.</summary>
        protected virtual StateRecord RequireHolder(StateHandlerContext ctx, StateRecord current)
        {
            long token = ctx.LockToken.Value;
            if (current == null || current.Status != IdempotencyStatus.Processing || current.Attempt != token)
            {
                throw new StaleLockException(
                    ctx.ItemKey, token, current == null ? (long?)null : current.Attempt,
                    current == null ? IdempotencyStatus.None.Label() : current.Status.Label());
            }
            return current;
        }

        /// <summary>What the store keeps of a payload: the text as written, so <c>-0.0</c> and <c>1.0</c> come back as sent.</summary>
        protected virtual string Stored(string data)
        {
            return data;
        }

        /// <summary>
        /// Whether a fenced write finds its own outcome already stored under its token: this
        /// status, unlocked, this error detail, this data (or none given). Such a retry succeeds
        /// and writes nothing. Both texts are canonical JSON, so comparing them is exact.
        /// </summary>
        public static bool WriteLanded(StateRecord current, long token, IdempotencyStatus status, string data, string errorDetail)
        {
            if (current == null || current.Attempt != token || current.Status != status || current.LockedUntil.HasValue)
            {
                return false;
            }
            if (!string.Equals(current.ErrorDetail, errorDetail, StringComparison.Ordinal)) return false;
            return data == null || string.Equals(current.Data, data, StringComparison.Ordinal);
        }

        /// <summary>A live lock of another worker refuses every write made without a token.</summary>
        public static void RefuseLiveLock(StateHandlerContext ctx, StateRecord current, DateTime now)
        {
            if (IsLive(current, now))
            {
                throw new LockHeldException(ctx.ItemKey, Instants.Format(current.LockedUntil.Value));
            }
        }

        /// <summary>Refuses a payload over <see cref="MaxDataBytes"/> bytes of UTF-8, before anything is written.</summary>
        public static void CheckData(string data)
        {
            if (data == null) return;
            if (data.Length * 3L <= MaxDataBytes) return; // no character takes more than 3 bytes per UTF-16 unit
            int size = Encoding.UTF8.GetByteCount(data);
            if (size > MaxDataBytes) throw new PayloadTooLargeException(size, MaxDataBytes);
        }

        /// <summary>
        /// The current record after a write: a new one, or <paramref name="current"/> changed.
        /// Every write stamps the writer, <c>UpdatedAt</c> and <c>RetainUntil</c>; data
        /// <c>null</c> keeps the stored data; the error detail changes only when
        /// <paramref name="setsErrorDetail"/>.
        /// </summary>
        protected StateRecord Write(
            StateHandlerContext ctx,
            DateTime now,
            StateRecord current,
            IdempotencyStatus status,
            DateTime? lockedUntil,
            string data,
            long? attempt,
            bool setsErrorDetail,
            string errorDetail)
        {
            var retainUntil = ctx.HandlerConfig.RetainUntil(now);
            string stored = data == null ? null : Stored(data);
            if (current == null)
            {
                return new StateRecord(
                    ctx.RecordKey, status, attempt ?? 0, lockedUntil, stored, setsErrorDetail ? errorDetail : null,
                    ctx.EntityExecutionId, ctx.SourceAppId, now, now, retainUntil);
            }
            return new StateRecord(
                current.Key, status, attempt ?? current.Attempt, lockedUntil, stored ?? current.Data,
                setsErrorDetail ? errorDetail : current.ErrorDetail, ctx.EntityExecutionId, ctx.SourceAppId,
                current.CreatedAt, now, retainUntil);
        }
    }
}
