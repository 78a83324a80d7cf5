// One stored record, current or superseded, as every handler returns it from GetAsync.

using System;

namespace Dsm.DataStateMachine
{
    /// <summary>
    /// A record of <c>Process_StateLogs</c>. Immutable: a write makes a new one, so a record
    /// handed to a caller never changes under it.
    /// </summary>
    public sealed class StateRecord
    {
        public StateRecord(
            RecordKey key,
            IdempotencyStatus status,
            long attempt,
            DateTime? lockedUntil,
            string data,
            string errorDetail,
            string entityExecutionId,
            string sourceAppId,
            DateTime createdAt,
            DateTime updatedAt,
            DateTime? retainUntil)
        {
            Key = key;
            Status = status;
            Attempt = attempt;
            LockedUntil = lockedUntil;
            Data = data;
            ErrorDetail = errorDetail;
            EntityExecutionId = entityExecutionId;
            SourceAppId = sourceAppId;
            CreatedAt = createdAt;
            UpdatedAt = updatedAt;
            RetainUntil = retainUntil;
        }

        public RecordKey Key { get; }
        public IdempotencyStatus Status { get; }
        /// <summary>The fencing token of the latest acquisition (0 if never acquired).</summary>
        public long Attempt { get; }
        /// <summary>End of the processing lock; <c>null</c> unless Processing.</summary>
        public DateTime? LockedUntil { get; }
        /// <summary>The payload as the JSON text written, exactly; <c>null</c>: no data.</summary>
        public string Data { get; }
        public string ErrorDetail { get; }
        /// <summary>The run of the latest write.</summary>
        public string EntityExecutionId { get; }
        /// <summary>The application of the latest write.</summary>
        public string SourceAppId { get; }
        public DateTime CreatedAt { get; }
        public DateTime UpdatedAt { get; }
        /// <summary>After this instant the retention sweep expires the record; <c>null</c>: kept forever.</summary>
        public DateTime? RetainUntil { get; }

        /// <summary>The same record after a sweep or a supersede: status, lock and stamp changed, nothing else.</summary>
        public StateRecord Marked(IdempotencyStatus status, DateTime updatedAt, string errorDetail)
        {
            return new StateRecord(
                Key, status, Attempt, null, Data, errorDetail, EntityExecutionId, SourceAppId, CreatedAt, updatedAt,
                RetainUntil);
        }
    }
}
