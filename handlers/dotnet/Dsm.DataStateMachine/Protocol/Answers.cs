// Answers as the protocol wants them: one JSON object per line, pure ASCII (every other
// character escaped as \uXXXX, so a lone surrogate survives and no reader can split a line
// inside a character), records with every field, instants to the microsecond.

using System;
using System.Collections.Generic;
using System.Data.Common;
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
            string kind;
            var fields = new List<KeyValuePair<string, object>>();
            if (error is PayloadTooLargeException)
            {
                var e = (PayloadTooLargeException)error;
                kind = "payload_too_large";
                fields.Add(Field("size", e.Size));
                fields.Add(Field("limit", e.Limit));
            }
            else if (error is InvalidItemException)
            {
                kind = "invalid_item";
                fields.Add(Field("field", ((InvalidItemException)error).Field ?? ""));
            }
            else if (error is LockHeldException)
            {
                var e = (LockHeldException)error;
                kind = "lock_held";
                fields.Add(Field("item_key", e.ItemKey));
                fields.Add(Field("locked_until", e.LockedUntil));
            }
            else if (error is LockNotHeldException)
            {
                var e = (LockNotHeldException)error;
                kind = "lock_not_held";
                fields.Add(Field("item_key", e.ItemKey));
                fields.Add(Field("operation", e.Operation));
            }
            else if (error is StaleLockException)
            {
                var e = (StaleLockException)error;
                kind = "stale_lock";
                fields.Add(Field("item_key", e.ItemKey));
                fields.Add(Field("token", e.Token));
                fields.Add(Field("current_token", e.CurrentToken));
                fields.Add(Field("status", e.Status));
            }
            else if (error is ForbiddenTransitionException)
            {
                var e = (ForbiddenTransitionException)error;
                kind = "forbidden_transition";
                fields.Add(Field("source", e.SourceStatus));
                fields.Add(Field("target", e.TargetStatus));
                fields.Add(Field("allowed", e.Allowed));
                fields.Add(Field("item_key", e.ItemKey));
            }
            else if (error is UnsupportedStatusException)
            {
                var e = (UnsupportedStatusException)error;
                kind = "unsupported_status";
                fields.Add(Field("status", e.Status));
                fields.Add(Field("use", e.Use));
            }
            else if (error is InstantOutOfRangeException)
            {
                var e = (InstantOutOfRangeException)error;
                kind = "instant_out_of_range";
                fields.Add(Field("option", e.Option));
                fields.Add(Field("now", e.Now));
                fields.Add(Field("duration", e.Duration));
            }
            else if (error is StoreException)
            {
                kind = "store_error";
            }
            else if (error is DbException)
            {
                // A database failure the handler did not wrap: the store failed, the outcome is unknown.
                kind = "store_error";
                error = new StoreException("the store failed: " + error.GetType().Name + ": " + error.Message, error);
            }
            else if (error is BadRequestException)
            {
                kind = "bad_request";
            }
            else
            {
                // No kind says what happened: the harness reports it with the type and the trace.
                into.Append("{\"kind\":\"internal\",\"message\":");
                String(into, error.ToString());
                into.Append(",\"type\":");
                String(into, error.GetType().FullName);
                into.Append('}');
                return;
            }
            into.Append("{\"kind\":\"").Append(kind).Append("\",\"message\":");
            String(into, error.Message);
            foreach (var field in fields)
            {
                into.Append(",\"").Append(field.Key).Append("\":");
                Value(into, field.Value);
            }
            into.Append('}');
        }

        private static KeyValuePair<string, object> Field(string name, object value)
        {
            return new KeyValuePair<string, object>(name, value);
        }

        private static void Value(StringBuilder into, object value)
        {
            if (value == null) into.Append("null");
            else if (value is string) String(into, (string)value);
            else if (value is long) into.Append(((long)value).ToString(CultureInfo.InvariantCulture));
            else if (value is IEnumerable<string>)
            {
                into.Append('[');
                bool first = true;
                foreach (var item in (IEnumerable<string>)value)
                {
                    if (!first) into.Append(',');
                    first = false;
                    String(into, item);
                }
                into.Append(']');
            }
            else throw new ArgumentException("no JSON form for " + value.GetType());
        }
    }

    /// <summary>The request is malformed (answered with kind bad_request).</summary>
    internal sealed class BadRequestException : Exception
    {
        public BadRequestException(string message) : base(message) { }
    }
}
