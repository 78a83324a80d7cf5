// One request line of the handler protocol (docs/protocol.md), read field by field
// (JsonLine): no object model is built, and no text is ever taken for a date or a number.
//
// data_json arrives as a JSON string whose content is the payload's canonical JSON text;
// it is handed to the handler exactly as sent. Nothing here parses a payload, so no number
// in it can lose a digit, a sign or its ".0" on the way.

using System;
using System.Collections.Generic;

namespace Dsm.DataStateMachine.Protocol
{
    internal sealed class ProtocolRequest
    {
        public bool HasId;
        public long Id;
        public string Op;
        public DateTime Now;
        public long? ProtocolVersion;
        /// <summary>Every version the harness offers (<c>protocols</c>), or null when it sent no list.</summary>
        public List<long> Protocols;
        public string Store;
        public bool DropStore;
        public StateHandlerContext Context;
        public IdempotencyStatus Status;
        public string StatusText;
        public bool HasData;
        public string Data;
        public string ErrorDetail;
        /// <summary>What is wrong with the request (answered as bad_request), or null.</summary>
        public string Problem;
        /// <summary>Why the line is not JSON, when its id was read before that was found; else null.</summary>
        public string NotJson;

        /// <summary>
        /// The request a line holds. A line that is not JSON throws <see cref="JsonLineException"/>,
        /// unless its id was read before the fault: then the request has that id and
        /// <see cref="NotJson"/> and <see cref="Problem"/> say what is wrong, so the client is
        /// answered bad_request instead of waiting for an answer that never comes.
        /// </summary>
        public static ProtocolRequest Parse(string line)
        {
            var request = new ProtocolRequest();
            try
            {
                request.Read(new JsonLine(line));
            }
            catch (JsonLineException error)
            {
                if (!request.HasId) throw;
                request.NotJson = error.Message;
                request.Problem = "the request line is " + error.Message;
            }
            return request;
        }

        private void Read(JsonLine json)
        {
            var request = this;
            string now = null;
            string name;
            bool first = true;
            while (json.NextMember(first, out name))
            {
                first = false;
                switch (name)
                {
                    case "id":
                        long id;
                        if (Integer(json, out id) && id >= 1)
                        {
                            request.Id = id;
                            request.HasId = true;
                        }
                        break;
                    case "op":
                        request.Op = Text(json);
                        break;
                    case "now":
                        now = Text(json);
                        break;
                    case "protocol":
                        long version;
                        if (Integer(json, out version)) request.ProtocolVersion = version;
                        break;
                    case "protocols":
                        request.Protocols = Integers(json);
                        break;
                    case "store":
                        request.Store = Text(json);
                        break;
                    case "drop_store":
                        var kind = json.Peek();
                        if (kind == JsonKind.True || kind == JsonKind.False) request.DropStore = json.ReadBoolean();
                        else json.Skip();
                        break;
                    case "context":
                        request.Context = ReadContext(json, request);
                        break;
                    case "status":
                        request.StatusText = Text(json);
                        break;
                    case "data_json":
                        request.HasData = json.Peek() == JsonKind.String || json.Peek() == JsonKind.Null;
                        request.Data = Text(json);
                        break;
                    case "error_detail":
                        request.ErrorDetail = Text(json);
                        break;
                    default:
                        json.Skip();
                        break;
                }
            }
            json.End();
            request.Check(now);
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

        /// <summary>An integer value, or false when the value is anything else (which is read all the same).</summary>
        private static bool Integer(JsonLine json, out long value)
        {
            value = 0;
            if (json.Peek() == JsonKind.Number) return json.TryReadInteger(out value);
            json.Skip();
            return false;
        }

        /// <summary>The integers of an array (other elements are read and left out), or null for a non-array.</summary>
        private static List<long> Integers(JsonLine json)
        {
            if (json.Peek() != JsonKind.Array)
            {
                json.Skip();
                return null;
            }
            var numbers = new List<long>();
            for (bool first = true; json.NextElement(first); first = false)
            {
                long number;
                if (Integer(json, out number)) numbers.Add(number);
            }
            return numbers;
        }

        /// <summary>Whether open offers <paramref name="version"/>: in <c>protocols</c>, else as <c>protocol</c> alone.</summary>
        public bool Offers(long version)
        {
            return Protocols != null ? Protocols.Contains(version) : ProtocolVersion == version;
        }

        /// <summary>A string value, or null when the value is anything else (which is read all the same).</summary>
        private static string Text(JsonLine json)
        {
            if (json.Peek() == JsonKind.String) return json.ReadString();
            json.Skip();
            return null;
        }

        /// <summary>An integer of at least 1, or null: true when the value is one of the two.</summary>
        private static bool PositiveOrNull(JsonLine json, out long? value)
        {
            value = null;
            if (json.TakeNull()) return true;
            long number;
            if (!Integer(json, out number) || number < 1) return false;
            value = number;
            return true;
        }

        private static StateHandlerContext ReadContext(JsonLine json, ProtocolRequest request)
        {
            if (json.Peek() != JsonKind.Object)
            {
                request.Refuse("'context' must be an object");
                json.Skip();
                return null;
            }
            string tenant = null, sourceApp = null, scopeCode = null, entity = null, execution = null;
            string itemEntityKey = null, itemKey = null;
            long scopeId = 0, lockDuration = 0;
            long? retention = null, token = null;
            bool hasScope = false, hasLock = false, hasRetention = false, hasToken = false;
            string name;
            bool first = true;
            while (json.NextMember(first, out name))
            {
                first = false;
                switch (name)
                {
                    case "tenant_id": tenant = Text(json); break;
                    case "source_app_id": sourceApp = Text(json); break;
                    case "scope_code": scopeCode = Text(json); break;
                    case "entity_id": entity = Text(json); break;
                    case "entity_execution_id": execution = Text(json); break;
                    case "item_entity_key": itemEntityKey = Text(json); break;
                    case "item_key": itemKey = Text(json); break;
                    case "scope_id":
                        hasScope = Integer(json, out scopeId) && scopeId >= int.MinValue && scopeId <= int.MaxValue;
                        break;
                    case "lock_duration_us":
                        hasLock = Integer(json, out lockDuration) && lockDuration >= 1 && lockDuration <= MaxDurationMicroseconds;
                        break;
                    case "retention_us":
                        hasRetention = PositiveOrNull(json, out retention) && (retention ?? 0) <= MaxDurationMicroseconds;
                        break;
                    case "lock_token":
                        hasToken = PositiveOrNull(json, out token);
                        break;
                    default:
                        json.Skip();
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

        /// <summary>The longest duration a TimeSpan holds in whole microseconds (far beyond any option).</summary>
        private static readonly long MaxDurationMicroseconds = TimeSpan.MaxValue.Ticks / 10;
    }
}
