// One request line of the handler protocol (docs/protocol.md), read with Newtonsoft.Json's
// token reader: no object model is built, and no string is ever taken for a date.
//
// data_json arrives as a JSON string whose content is the payload's canonical JSON text;
// it is handed to the handler exactly as sent. Nothing here parses a payload, so no number
// in it can lose a digit, a sign or its ".0" on the way.

using System;
using System.IO;
using Newtonsoft.Json;

namespace Dsm.DataStateMachine.Protocol
{
    internal sealed class ProtocolRequest
    {
        public bool HasId;
        public long Id;
        public string Op;
        public DateTime Now;
        public long? ProtocolVersion;
        public string Store;
        public bool DropStore;
        public StateHandlerContext Context;
        public bool HasStatus;
        public IdempotencyStatus Status;
        public string StatusText;
        public bool HasData;
        public string Data;
        public string ErrorDetail;
        /// <summary>What is wrong with the request (answered as bad_request), or null.</summary>
        public string Problem;

        /// <summary>A short description for logs: "request 7 (try_acquire_lock 'INV-1')".</summary>
        public string Label
        {
            get
            {
                string item = Context == null ? "" : " " + DsmException.Echo(Context.ItemKey);
                return "request " + Id + " (" + Op + item + ")";
            }
        }

        /// <summary>The request a line holds. Throws <see cref="JsonException"/> when the line is not JSON.</summary>
        public static ProtocolRequest Parse(string line)
        {
            var request = new ProtocolRequest();
            string now = null;
            using (var reader = new JsonTextReader(new StringReader(line)))
            {
                reader.DateParseHandling = DateParseHandling.None;
                reader.FloatParseHandling = FloatParseHandling.Double;
                if (!reader.Read() || reader.TokenType != JsonToken.StartObject)
                {
                    throw new JsonReaderException("a request is a JSON object");
                }
                while (reader.Read() && reader.TokenType == JsonToken.PropertyName)
                {
                    string name = (string)reader.Value;
                    reader.Read();
                    switch (name)
                    {
                        case "id":
                            long id;
                            if (TryInteger(reader, out id) && id >= 1)
                            {
                                request.Id = id;
                                request.HasId = true;
                            }
                            break;
                        case "op":
                            request.Op = reader.TokenType == JsonToken.String ? (string)reader.Value : null;
                            break;
                        case "now":
                            now = reader.TokenType == JsonToken.String ? (string)reader.Value : null;
                            break;
                        case "protocol":
                            long version;
                            if (TryInteger(reader, out version)) request.ProtocolVersion = version;
                            break;
                        case "store":
                            request.Store = reader.TokenType == JsonToken.String ? (string)reader.Value : null;
                            break;
                        case "drop_store":
                            request.DropStore = reader.TokenType == JsonToken.Boolean && (bool)reader.Value;
                            break;
                        case "context":
                            request.Context = ReadContext(reader, request);
                            break;
                        case "status":
                            request.HasStatus = true;
                            request.StatusText = reader.TokenType == JsonToken.String ? (string)reader.Value : null;
                            break;
                        case "data_json":
                            request.HasData = reader.TokenType == JsonToken.String || reader.TokenType == JsonToken.Null;
                            request.Data = reader.TokenType == JsonToken.String ? (string)reader.Value : null;
                            break;
                        case "error_detail":
                            request.ErrorDetail = reader.TokenType == JsonToken.String ? (string)reader.Value : null;
                            break;
                        default:
                            reader.Skip();
                            break;
                    }
                }
            }
            request.Check(now);
            return request;
        }

        private void Check(string now)
        {
            if (Op == null)
            {
                Refuse("the request has no op");
                return;
            }
            if (!Instants.TryParse(now, out Now))
            {
                Refuse("'now' must be an instant like 2026-03-02T09:30:01.000000Z, got " + (now == null ? "none" : DsmException.Echo(now)));
            }
            switch (Op)
            {
                case "open":
                    if (ProtocolVersion == null) Refuse("open needs 'protocol', the version the harness speaks");
                    break;
                case "close":
                case "reset_expired_locks":
                case "expire_past_retention":
                    break;
                case "exists":
                case "get":
                case "try_acquire_lock":
                    NeedContext();
                    break;
                case "set":
                    NeedContext();
                    if (StatusText == null || !Statuses.TryParseWireValue(StatusText, out Status))
                    {
                        Refuse("set needs 'status', one of none, processing, processed, failed, superseded, skipped, expired");
                    }
                    if (!HasData) Refuse("set needs 'data_json', a string or null");
                    break;
                case "release_lock_as_failed":
                    NeedContext();
                    if (ErrorDetail == null) Refuse("release_lock_as_failed needs 'error_detail', a string");
                    break;
                case "upsert":
                    NeedContext();
                    if (!HasData) Refuse("upsert needs 'data_json', a string or null");
                    break;
                default:
                    Refuse("unknown op " + DsmException.Echo(Op));
                    break;
            }
        }

        private void NeedContext()
        {
            if (Context == null && Problem == null) Refuse(Op + " needs a 'context' object");
        }

        private void Refuse(string problem)
        {
            if (Problem == null) Problem = problem;
        }

        private static bool TryInteger(JsonReader reader, out long value)
        {
            value = 0;
            if (reader.TokenType != JsonToken.Integer || !(reader.Value is long)) return false;
            value = (long)reader.Value;
            return true;
        }

        private static StateHandlerContext ReadContext(JsonTextReader reader, ProtocolRequest request)
        {
            if (reader.TokenType != JsonToken.StartObject)
            {
                request.Refuse("'context' must be an object");
                reader.Skip();
                return null;
            }
            string tenant = null, sourceApp = null, scopeCode = null, entity = null, execution = null;
            string itemEntityKey = null, itemKey = null;
            long scopeId = 0, lockDuration = 0;
            long? retention = null, token = null;
            bool hasScope = false, hasLock = false, hasRetention = false, hasToken = false;
            while (reader.Read() && reader.TokenType == JsonToken.PropertyName)
            {
                string name = (string)reader.Value;
                reader.Read();
                long number;
                switch (name)
                {
                    case "tenant_id": tenant = Text(reader); break;
                    case "source_app_id": sourceApp = Text(reader); break;
                    case "scope_code": scopeCode = Text(reader); break;
                    case "entity_id": entity = Text(reader); break;
                    case "entity_execution_id": execution = Text(reader); break;
                    case "item_entity_key": itemEntityKey = Text(reader); break;
                    case "item_key": itemKey = Text(reader); break;
                    case "scope_id":
                        hasScope = TryInteger(reader, out scopeId) && scopeId >= int.MinValue && scopeId <= int.MaxValue;
                        break;
                    case "lock_duration_us":
                        hasLock = TryInteger(reader, out lockDuration) && lockDuration >= 1;
                        break;
                    case "retention_us":
                        hasRetention = reader.TokenType == JsonToken.Null || (TryInteger(reader, out number) && number >= 1);
                        if (reader.TokenType != JsonToken.Null && hasRetention) retention = (long)reader.Value;
                        break;
                    case "lock_token":
                        hasToken = reader.TokenType == JsonToken.Null || (TryInteger(reader, out number) && number >= 1);
                        if (reader.TokenType != JsonToken.Null && hasToken) token = (long)reader.Value;
                        break;
                    default:
                        reader.Skip();
                        break;
                }
            }
            if (tenant == null || sourceApp == null || scopeCode == null || entity == null || execution == null
                || itemEntityKey == null || itemKey == null || !hasScope || !hasLock || !hasRetention || !hasToken)
            {
                request.Refuse("'context' needs tenant_id, source_app_id, scope_id, scope_code, entity_id, " +
                               "entity_execution_id, item_entity_key, item_key (strings; scope_id an integer), " +
                               "lock_duration_us (an integer >= 1), retention_us and lock_token (integers >= 1 or null)");
                return null;
            }
            var config = new HandlerConfig(
                Instants.FromMicroseconds(lockDuration),
                retention.HasValue ? Instants.FromMicroseconds(retention.Value) : (TimeSpan?)null);
            return new StateHandlerContext(
                tenant, sourceApp, (int)scopeId, scopeCode, entity, execution, itemEntityKey, itemKey, config, token);
        }

        private static string Text(JsonReader reader)
        {
            if (reader.TokenType == JsonToken.String) return (string)reader.Value;
            if (reader.TokenType == JsonToken.StartObject || reader.TokenType == JsonToken.StartArray) reader.Skip();
            return null;
        }
    }
}
