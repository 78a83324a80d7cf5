// Answers as the protocol wants them: one JSON object per line, pure ASCII (every other
// character escaped as \uXXXX, so a lone surrogate survives and no reader can split a line
// inside a character), records with every field, instants to the microsecond.

using System;
using System.Data.Common;
using System.Diagnostics;
using System.Globalization;
using System.Reflection;
using System.Text;

namespace Dsm.DataStateMachine.Protocol
{
    internal static class Answers
    {
        private const string Hex = "0123456789abcdef";

        public static StringBuilder Begin(long id, bool error)
        {
            var line = new StringBuilder(160);
            line.Append("{\"id\":").Append(id.ToString(CultureInfo.InvariantCulture));
            line.Append(error ? ",\"error\":" : ",\"result\":");
            return line;
        }

        public static string End(StringBuilder line)
        {
            return line.Append("}\n").ToString();
        }

        public static void String(StringBuilder into, string text)
        {
            if (text == null)
            {
                into.Append("null");
                return;
            }
            into.Append('"');
            int plain = 0;
            for (int i = 0; i < text.Length; i++)
            {
                char c = text[i];
                if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') continue;
                into.Append(text, plain, i - plain);
                plain = i + 1;
                if (c == '"') into.Append("\\\"");
                else if (c == '\\') into.Append("\\\\");
                else if (c == '\n') into.Append("\\n");
                else
                {
                    into.Append("\\u").Append(Hex[c >> 12]).Append(Hex[(c >> 8) & 15]).Append(Hex[(c >> 4) & 15]).Append(Hex[c & 15]);
                }
            }
            into.Append(text, plain, text.Length - plain);
            into.Append('"');
        }

        public static void Instant(StringBuilder into, DateTime? instant)
        {
            if (!instant.HasValue)
            {
                into.Append("null");
                return;
            }
            var chars = new char[29];
            chars[0] = '"';
            Instants.Write(instant.Value, chars, 1);
            chars[28] = '"';
            into.Append(chars);
        }

        public static void Number(StringBuilder into, long? value)
        {
            if (value.HasValue) into.Append(value.Value.ToString(CultureInfo.InvariantCulture));
            else into.Append("null");
        }

        public static void Record(StringBuilder into, StateRecord record)
        {
            if (record == null)
            {
                into.Append("null");
                return;
            }
            var key = record.Key;
            into.Append("{\"key\":{\"tenant_id\":");
            String(into, key.TenantId);
            into.Append(",\"scope_id\":").Append(key.ScopeId.ToString(CultureInfo.InvariantCulture));
            into.Append(",\"entity_id\":");
            String(into, key.EntityId);
            into.Append(",\"item_entity_key\":");
            String(into, key.ItemEntityKey);
            into.Append(",\"item_key\":");
            String(into, key.ItemKey);
            into.Append("},\"status\":\"").Append(record.Status.WireValue());
            into.Append("\",\"attempt\":").Append(record.Attempt.ToString(CultureInfo.InvariantCulture));
            into.Append(",\"locked_until\":");
            Instant(into, record.LockedUntil);
            into.Append(",\"data_json\":");
            String(into, record.Data);
            into.Append(",\"error_detail\":");
            String(into, record.ErrorDetail);
            into.Append(",\"entity_execution_id\":");
            String(into, record.EntityExecutionId);
            into.Append(",\"source_app_id\":");
            String(into, record.SourceAppId);
            into.Append(",\"created_at\":");
            Instant(into, record.CreatedAt);
            into.Append(",\"updated_at\":");
            Instant(into, record.UpdatedAt);
            into.Append(",\"retain_until\":");
            Instant(into, record.RetainUntil);
            into.Append('}');
        }

        /// <summary>The cause behind the wrappers a Task or a reflection call puts around an exception.</summary>
        public static Exception Unwrap(Exception error)
        {
            while (true)
            {
                var aggregate = error as AggregateException;
                if (aggregate != null && aggregate.InnerExceptions.Count == 1)
                {
                    error = aggregate.InnerExceptions[0];
                    continue;
                }
                var invocation = error as TargetInvocationException;
                if (invocation != null && invocation.InnerException != null)
                {
                    error = invocation.InnerException;
                    continue;
                }
                return error;
            }
        }

        /// <summary>
        /// The <c>error</c> member an exception stands for: its kind and the fields the harness
        /// raises the Python error with. A subclass is matched before its base.
        /// </summary>
        public static void Error(StringBuilder into, Exception error)
        {
            error = Unwrap(error);
            if (error is DbException)
            {
                // A database failure the handler did not wrap: the store failed, the outcome is unknown.
                error = new StoreException("the store failed: " + error.GetType().Name + ": " + error.Message, error);
            }
            string kind = KindOf(error);
            if (kind == null)
            {
                // No kind says what happened: the harness reports it with the type and the trace.
                into.Append("{\"kind\":\"internal\",\"message\":");
                String(into, error.ToString() + WithoutLines(error));
                into.Append(",\"type\":");
                String(into, error.GetType().FullName);
                into.Append('}');
                return;
            }
            into.Append("{\"kind\":\"").Append(kind).Append("\",\"message\":");
            String(into, error.Message);
            var tooLarge = error as PayloadTooLargeException;
            var invalid = error as InvalidItemException;
            var held = error as LockHeldException;
            var notHeld = error as LockNotHeldException;
            var stale = error as StaleLockException;
            var forbidden = error as ForbiddenTransitionException;
            var unsupported = error as UnsupportedStatusException;
            var outOfRange = error as InstantOutOfRangeException;
            if (tooLarge != null)
            {
                Field(into, "size", tooLarge.Size);
                Field(into, "limit", tooLarge.Limit);
            }
            else if (invalid != null)
            {
                Field(into, "field", invalid.Field ?? "");
            }
            else if (held != null)
            {
                Field(into, "item_key", held.ItemKey);
                Field(into, "locked_until", held.LockedUntil);
            }
            else if (notHeld != null)
            {
                Field(into, "item_key", notHeld.ItemKey);
                Field(into, "operation", notHeld.Operation);
            }
            else if (stale != null)
            {
                Field(into, "item_key", stale.ItemKey);
                Field(into, "token", stale.Token);
                Field(into, "current_token", stale.CurrentToken);
                Field(into, "status", stale.Status);
            }
            else if (forbidden != null)
            {
                Field(into, "source", forbidden.SourceStatus);
                Field(into, "target", forbidden.TargetStatus);
                into.Append(",\"allowed\":[");
                for (int i = 0; i < forbidden.Allowed.Count; i++)
                {
                    if (i > 0) into.Append(',');
                    String(into, forbidden.Allowed[i]);
                }
                into.Append(']');
                Field(into, "item_key", forbidden.ItemKey);
            }
            else if (unsupported != null)
            {
                Field(into, "status", unsupported.Status);
                Field(into, "use", unsupported.Use);
            }
            else if (outOfRange != null)
            {
                Field(into, "option", outOfRange.Option);
                Field(into, "now", outOfRange.Now);
                Field(into, "duration", outOfRange.Duration);
            }
            into.Append('}');
        }

        /// <summary>
        /// What to do when a trace names no file and line: empty when some frame has them (the
        /// handler was built with debug symbols, and Mono was started with --debug).
        /// </summary>
        internal static string WithoutLines(Exception error)
        {
            var frames = new StackTrace(error, true).GetFrames();
            if (frames == null || frames.Length == 0) return "";
            foreach (var frame in frames)
            {
                if (frame.GetFileLineNumber() > 0) return "";
            }
            return "\n(no file or line numbers in this trace: build the handler with debug symbols, " +
                "mcs -debug or a .pdb beside the DLL, and under Mono start it with mono --debug)";
        }

        /// <summary>The protocol's kind for an exception, or null for one no kind names.</summary>
        internal static string KindOf(Exception error)
        {
            if (error is PayloadTooLargeException) return "payload_too_large";
            if (error is InvalidItemException) return "invalid_item";
            if (error is LockHeldException) return "lock_held";
            if (error is LockNotHeldException) return "lock_not_held";
            if (error is StaleLockException) return "stale_lock";
            if (error is ForbiddenTransitionException) return "forbidden_transition";
            if (error is UnsupportedStatusException) return "unsupported_status";
            if (error is InstantOutOfRangeException) return "instant_out_of_range";
            if (error is StoreException) return "store_error";
            if (error is BadRequestException) return "bad_request";
            return null;
        }

        private static void Field(StringBuilder into, string name, string value)
        {
            into.Append(",\"").Append(name).Append("\":");
            String(into, value);
        }

        private static void Field(StringBuilder into, string name, long? value)
        {
            into.Append(",\"").Append(name).Append("\":");
            Number(into, value);
        }
    }

    /// <summary>The request is malformed (answered with kind bad_request).</summary>
    internal sealed class BadRequestException : Exception
    {
        public BadRequestException(string message) : base(message) { }
    }
}
