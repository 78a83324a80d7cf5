// The per-call context a handler receives: where the record lives, who writes it, the node's
// options and the caller's fencing token (reference_engine/context.py and config.py).

using System;

namespace Dsm.DataStateMachine
{
    /// <summary>
    /// A node's options a handler needs per call: how long a lock lives and how long a record
    /// is kept (<c>null</c>: forever). Both are whole microseconds when they come from the kit.
    /// </summary>
    public sealed class HandlerConfig
    {
        public HandlerConfig(TimeSpan lockDuration, TimeSpan? retention)
        {
            LockDuration = lockDuration;
            Retention = retention;
        }

        public TimeSpan LockDuration { get; }
        public TimeSpan? Retention { get; }

        /// <summary>
        /// When a lock taken at <paramref name="now"/> expires. Past the last instant a record
        /// can hold it is an <see cref="InstantOutOfRangeException"/>, never an overflow in
        /// the middle of a write.
        /// </summary>
        public DateTime LockedUntil(DateTime now)
        {
            return Instants.After(now, LockDuration, "lockDuration");
        }

        /// <summary>Until when a record written at <paramref name="now"/> is kept (<c>null</c>: forever).</summary>
        public DateTime? RetainUntil(DateTime now)
        {
            return Retention.HasValue ? Instants.After(now, Retention.Value, "retention") : (DateTime?)null;
        }
    }

    /// <summary>
    /// A record's identity: (tenant, scope, entity, item entity key, item key), compared
    /// exactly as text. No trimming, case folding or normalisation, and no joined string
    /// that two different keys could both produce.
    /// </summary>
    public sealed class RecordKey : IEquatable<RecordKey>
    {
        public RecordKey(string tenantId, int scopeId, string entityId, string itemEntityKey, string itemKey)
        {
            TenantId = tenantId;
            ScopeId = scopeId;
            EntityId = entityId;
            ItemEntityKey = itemEntityKey;
            ItemKey = itemKey;
        }

        public string TenantId { get; }
        public int ScopeId { get; }
        public string EntityId { get; }
        public string ItemEntityKey { get; }
        public string ItemKey { get; }

        public bool Equals(RecordKey other)
        {
            return other != null
                && ScopeId == other.ScopeId
                && string.Equals(TenantId, other.TenantId, StringComparison.Ordinal)
                && string.Equals(EntityId, other.EntityId, StringComparison.Ordinal)
                && string.Equals(ItemEntityKey, other.ItemEntityKey, StringComparison.Ordinal)
                && string.Equals(ItemKey, other.ItemKey, StringComparison.Ordinal);
        }

        public override bool Equals(object obj)
        {
            return Equals(obj as RecordKey);
        }

        public override int GetHashCode()
        {
            unchecked
            {
                int hash = StringComparer.Ordinal.GetHashCode(ItemKey);
                hash = hash * 31 + StringComparer.Ordinal.GetHashCode(EntityId);
                hash = hash * 31 + StringComparer.Ordinal.GetHashCode(ItemEntityKey);
                hash = hash * 31 + StringComparer.Ordinal.GetHashCode(TenantId);
                return hash * 31 + ScopeId;
            }
        }

        public override string ToString()
        {
            return TenantId + "/" + ScopeId + "/" + EntityId + "/" + ItemEntityKey + "/" + ItemKey;
        }
    }

    /// <summary>
    /// The context of one handler call. Immutable: the per-item, per-token copies are new
    /// instances (<see cref="WithLockToken"/>), so a handler never sees shared mutable state.
    /// </summary>
    public sealed class StateHandlerContext
    {
        public StateHandlerContext(
            string tenantId,
            string sourceAppId,
            int scopeId,
            string scopeCode,
            string entityId,
            string entityExecutionId,
            string itemEntityKey,
            string itemKey,
            HandlerConfig handlerConfig,
            long? lockToken = null)
        {
            TenantId = tenantId;
            SourceAppId = sourceAppId;
            ScopeId = scopeId;
            ScopeCode = scopeCode;
            EntityId = entityId;
            EntityExecutionId = entityExecutionId;
            ItemEntityKey = itemEntityKey ?? "";
            ItemKey = itemKey;
            HandlerConfig = handlerConfig;
            LockToken = lockToken;
            RecordKey = new RecordKey(TenantId, ScopeId, EntityId, ItemEntityKey, ItemKey);
        }

        public string TenantId { get; }
        /// <summary>The application that sent the message; stamped on every write.</summary>
        public string SourceAppId { get; }
        /// <summary>Scope table id: Tenant 1, Application 2, Workflow 3, Element 4, Thread 5.</summary>
        public int ScopeId { get; }
        public string ScopeCode { get; }
        public string EntityId { get; }
        /// <summary>The run (execution thread) making the call; stamped on every write.</summary>
        public string EntityExecutionId { get; }
        public string ItemEntityKey { get; }
        public string ItemKey { get; }
        public HandlerConfig HandlerConfig { get; }
        /// <summary>The fencing token of the caller's acquisition, or <c>null</c> when it holds none.</summary>
        public long? LockToken { get; }
        public RecordKey RecordKey { get; }

        /// <summary>The same call context carrying <paramref name="token"/> (what a node does after acquiring).</summary>
        public StateHandlerContext WithLockToken(long? token)
        {
            return new StateHandlerContext(
                TenantId, SourceAppId, ScopeId, ScopeCode, EntityId, EntityExecutionId, ItemEntityKey, ItemKey,
                HandlerConfig, token);
        }

        /// <summary>The context of another item of the same node execution, holding no token.</summary>
        public StateHandlerContext ForItem(string itemKey, string itemEntityKey = "")
        {
            return new StateHandlerContext(
                TenantId, SourceAppId, ScopeId, ScopeCode, EntityId, EntityExecutionId, itemEntityKey, itemKey,
                HandlerConfig);
        }
    }
}
