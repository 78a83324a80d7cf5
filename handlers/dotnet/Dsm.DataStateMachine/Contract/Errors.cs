// The named errors of the DataStateMachine (reference_engine/errors.py), one exception type each.
//
// Every error carries the fields a node author or an operator needs (what was asked, what is
// allowed) and a message that says how to fix it. The protocol host maps each to its error
// kind by type, so a handler throws these and writes no mapping of its own.

using System;
using System.Collections.Generic;
using System.Linq;

namespace Dsm.DataStateMachine
{
    /// <summary>Root of every error the DataStateMachine raises.</summary>
    public class DsmException : Exception
    {
        public DsmException(string message) : base(message) { }
        public DsmException(string message, Exception inner) : base(message, inner) { }

        /// <summary>How much of a bad value a message repeats: enough to recognise it, not a megabyte.</summary>
        public const int MaxEcho = 80;

        /// <summary>A value quoted for a message, cut to <see cref="MaxEcho"/> characters.</summary>
        public static string Echo(string value)
        {
            if (value == null) return "null";
            string quoted = "'" + value + "'";
            return quoted.Length <= MaxEcho ? quoted : quoted.Substring(0, MaxEcho) + "... (" + quoted.Length + " characters)";
        }
    }

    // --- configuration ------------------------------------------------------------------------

    /// <summary>A node's dataStateMachine block (or a handler's setup) is wrong; raised before any record is touched.</summary>
    public class ConfigurationException : DsmException
    {
        public ConfigurationException(string message) : base(message) { }
    }

    /// <summary>Settings are malformed: not JSON, not an object, or a field has the wrong type.</summary>
    public class InvalidSettingsException : ConfigurationException
    {
        public InvalidSettingsException(string message, string field = "") : base(message)
        {
            Field = field;
        }

        public string Field { get; }
    }

    /// <summary>The handler key is not registered.</summary>
    public class UnknownHandlerException : ConfigurationException
    {
        public UnknownHandlerException(string key, IEnumerable<string> registered)
            : base(UnknownMessage("handler", key, registered) + ". Register it, or fix the 'handler' field of the node's dataStateMachine block.")
        {
            Key = key;
            Registered = registered.ToArray();
        }

        public string Key { get; }
        public IReadOnlyList<string> Registered { get; }

        internal static string UnknownMessage(string what, string value, IEnumerable<string> allowed)
        {
            var list = allowed.Select(Echo).ToArray();
            return "unknown DataStateMachine " + what + " " + Echo(value) + "; " +
                (what == "handler" ? "registered handlers: " : "allowed scopes: ") +
                (list.Length == 0 ? "(none)" : string.Join(", ", list));
        }
    }

    /// <summary>The scope name is not one of the scope table's names.</summary>
    public class UnknownScopeException : ConfigurationException
    {
        public UnknownScopeException(string name, IEnumerable<string> allowed)
            : base(UnknownHandlerException.UnknownMessage("scope", name, allowed))
        {
            Name = name;
            Allowed = allowed.ToArray();
        }

        public string Name { get; }
        public IReadOnlyList<string> Allowed { get; }
    }

    /// <summary>An option is unknown or has a value outside its allowed range.</summary>
    public class InvalidOptionException : ConfigurationException
    {
        public InvalidOptionException(string option, string problem, IEnumerable<string> allowed = null)
            : base("invalid DataStateMachine option " + Echo(option) + ": " + problem +
                   (allowed == null || !allowed.Any() ? "" : "; allowed options: " + string.Join(", ", allowed.Select(Echo))))
        {
            Option = option;
            Problem = problem;
            Allowed = allowed == null ? new string[0] : allowed.ToArray();
        }

        public string Option { get; }
        public string Problem { get; }
        public IReadOnlyList<string> Allowed { get; }
    }

    /// <summary>
    /// <c>now</c> plus a lock duration or a retention is past 9999-12-31 23:59:59.999999 UTC,
    /// the last instant a record can hold. Only a clock near that end (or set there by
    /// mistake) gets here; nothing was written.
    /// </summary>
    public class InstantOutOfRangeException : InvalidOptionException
    {
        public InstantOutOfRangeException(string option, string now, string duration)
            : base(option,
                "now (" + now + ") + " + option + " (" + duration + ") is past 9999-12-31 23:59:59.999999 UTC, " +
                "the last instant a record can hold; nothing was written. Check the clock the handler reads, " +
                "or shorten " + option)
        {
            Now = now;
            Duration = duration;
        }

        public string Now { get; }
        public string Duration { get; }
    }

    /// <summary>The clock given to a handler returned something other than a UTC instant.</summary>
    public class InvalidClockException : ConfigurationException
    {
        public InvalidClockException(string clock, string returned)
            : base("the clock " + clock + " returned " + returned + "; a clock must return a UTC DateTime " +
                   "(DateTimeKind.Utc). Nothing was written")
        {
            Clock = clock;
            Returned = returned;
        }

        public string Clock { get; }
        public string Returned { get; }
    }

    /// <summary>Two workflows sharing handlers use one node id with Element scope.</summary>
    public class DuplicateElementException : ConfigurationException
    {
        public DuplicateElementException(string elementId, string workflowId, string otherWorkflowId)
            : base("node id '" + elementId + "' of workflow '" + workflowId + "' is already used with Element scope by " +
                   "workflow '" + otherWorkflowId + "'; Element-scope records are keyed by the node id alone, so the two " +
                   "nodes would share their records. Element ids must be unique across the workflows that share a " +
                   "handler registry: rename one of the nodes")
        {
            ElementId = elementId;
            WorkflowId = workflowId;
            OtherWorkflowId = otherWorkflowId;
        }

        public string ElementId { get; }
        public string WorkflowId { get; }
        public string OtherWorkflowId { get; }
    }

    /// <summary>A handler factory cannot build a handler the host can drive.</summary>
    public class FactoryException : ConfigurationException
    {
        public FactoryException(string factory, string problem, string allowed)
            : base("the factory " + Echo(factory) + " " + problem + "; " + allowed)
        {
            Factory = factory;
            Problem = problem;
            AllowedText = allowed;
        }

        public string Factory { get; }
        public string Problem { get; }
        public string AllowedText { get; }
    }

    /// <summary>A node type that must not run unguarded was configured without a dataStateMachine block.</summary>
    public class MissingDataStateMachineException : ConfigurationException
    {
        public MissingDataStateMachineException(string nodeType, string nodeId)
            : base("node '" + nodeId + "' of type '" + nodeType + "' needs a 'dataStateMachine' block in its settings " +
                   "(its side effect must not repeat); add e.g. {\"dataStateMachine\": {\"handler\": \"built-in\", " +
                   "\"scope\": \"Element\"}}")
        {
            NodeType = nodeType;
            NodeId = nodeId;
        }

        public string NodeType { get; }
        public string NodeId { get; }
    }

    // --- the lifecycle ------------------------------------------------------------------------

    /// <summary>A status change the transition table forbids; the record is left unchanged.</summary>
    public class ForbiddenTransitionException : DsmException
    {
        public ForbiddenTransitionException(string source, string target, IEnumerable<string> allowed, string itemKey = "")
            : base("transition " + source + " -> " + target + " is not allowed" +
                   (string.IsNullOrEmpty(itemKey) ? "" : " for item " + Echo(itemKey)) +
                   "; allowed from " + source + ": " + Listing(allowed))
        {
            SourceStatus = source;
            TargetStatus = target;
            Allowed = allowed.ToArray();
            ItemKey = itemKey ?? "";
        }

        /// <summary>The status label the record had ("Skipped").</summary>
        public string SourceStatus { get; }
        /// <summary>The status label asked for ("Superseded").</summary>
        public string TargetStatus { get; }
        public IReadOnlyList<string> Allowed { get; }
        public string ItemKey { get; }

        private static string Listing(IEnumerable<string> values)
        {
            var list = values.Select(Echo).ToArray();
            return list.Length == 0 ? "(none)" : string.Join(", ", list);
        }
    }

    /// <summary><c>SetAsync</c> was asked for a status only another operation may write.</summary>
    public class UnsupportedStatusException : DsmException
    {
        public UnsupportedStatusException(string status, string use)
            : base("set() cannot write status " + status + "; use " + use + " instead")
        {
            Status = status;
            Use = use;
        }

        public string Status { get; }
        public string Use { get; }
    }

    /// <summary>A write that needs the processing lock was made without a valid one.</summary>
    public abstract class LockException : DsmException
    {
        protected LockException(string message, string itemKey, long? token = null) : base(message)
        {
            ItemKey = itemKey;
            Token = token;
        }

        public string ItemKey { get; }
        public long? Token { get; }
    }

    /// <summary>Another worker holds a live lock on the item; wait for it or for the sweep.</summary>
    public class LockHeldException : LockException
    {
        public LockHeldException(string itemKey, string lockedUntil)
            : base("item " + Echo(itemKey) + " is locked by another worker until " + lockedUntil +
                   "; call TryAcquireLockAsync first and only write when it returns a token", itemKey)
        {
            LockedUntil = lockedUntil;
        }

        public string LockedUntil { get; }
    }

    /// <summary>The caller never acquired the lock it is trying to complete or release.</summary>
    public class LockNotHeldException : LockException
    {
        public LockNotHeldException(string itemKey, string operation)
            : base(operation + " on item " + Echo(itemKey) + " needs the processing lock, and this execution never " +
                   "acquired it; call TryAcquireLockAsync first", itemKey)
        {
            Operation = operation;
        }

        public string Operation { get; }
    }

    /// <summary>
    /// Fencing: the caller's token no longer holds the record; its write is rejected and
    /// nothing changes. The caller's side effect may already have happened: this error is
    /// what lets operators see the lease violation instead of a silent overwrite.
    /// </summary>
    public class StaleLockException : LockException
    {
        public StaleLockException(string itemKey, long token, long? currentToken, string status)
            : base("stale lock on item " + Echo(itemKey) + ": this execution holds fencing token " + token + ", but " +
                   WhatHappened(token, currentToken, status) + "; this write is rejected", itemKey, token)
        {
            CurrentToken = currentToken;
            Status = status;
        }

        public long? CurrentToken { get; }
        /// <summary>The record's status label ("Processing"), or "None" when there is no record.</summary>
        public string Status { get; }

        private static string WhatHappened(long token, long? current, string status)
        {
            if (current == null) return "the record no longer exists (it expired and was removed, or was deleted)";
            if (current.Value != token)
            {
                return "the record is now " + status + " with token " + current.Value +
                       ": the lock was taken over by attempt " + current.Value;
            }
            if (status == "Failed")
            {
                return "this token's lock already ended: the record is Failed with this token, so either the lock " +
                       "expired and was swept, or this token's own release landed with another error detail " +
                       "(retrying the write that landed succeeds)";
            }
            if (status == "Processing") return "the record is Processing with this token, yet the store refused the write";
            return "this token's lock already ended: the record is " + status + " with this token, from a write of " +
                   "this token that asked for another outcome (retrying the write that landed succeeds; this one asks " +
                   "for something else)";
        }
    }

    // --- input --------------------------------------------------------------------------------

    /// <summary>An item key, entity key or data payload cannot be stored as given.</summary>
    public class InvalidItemException : DsmException
    {
        public InvalidItemException(string message, string field) : base(message)
        {
            Field = field;
        }

        public string Field { get; }
    }

    /// <summary>The serialised data payload exceeds the size limit.</summary>
    public class PayloadTooLargeException : InvalidItemException
    {
        public PayloadTooLargeException(long size, long limit)
            : base("data payload is " + size + " bytes serialised; the limit is " + limit + " bytes. Store a " +
                   "reference to large results instead of the results themselves", "data")
        {
            Size = size;
            Limit = limit;
        }

        public long Size { get; }
        public long Limit { get; }
    }

    // --- the store ----------------------------------------------------------------------------

    /// <summary>
    /// The handler's store failed (connection dropped, database locked...). The outcome is
    /// unknown to the caller; retrying is safe because every operation is idempotent or fenced.
    /// </summary>
    public class StoreException : DsmException
    {
        public StoreException(string message) : base(message) { }
        public StoreException(string message, Exception inner) : base(message, inner) { }
    }

    /// <summary>
    /// The store is no longer the one the handler opened (its data was lost or replaced):
    /// answering from it would make finished work look undone. Nothing is written.
    /// </summary>
    public class StoreLostException : StoreException
    {
        public StoreLostException(string store, string reason)
            : base("the " + store + " is not the store this handler opened: " + reason + ". Its records were lost or " +
                   "replaced, so finished work would look undone and be repeated; nothing was written. Restore the " +
                   "store (or accept the loss) and restart the handler")
        {
            Store = store;
            Reason = reason;
        }

        public string Store { get; }
        public string Reason { get; }
    }
}
