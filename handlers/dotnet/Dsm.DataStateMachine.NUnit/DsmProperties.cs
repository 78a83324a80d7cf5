// The properties dsm verify judges, by name, in the order it reports them: the cases a
// conformance fixture shows before anything has run. They are listed here, not read from a
// first run, so that discovering the tests (an IDE, dotnet test --list-tests) starts no
// verification. tests/integration/test_dotnet_conformance.py compares this list with
// dsm_sim/conformance/properties.py; a property a newer dsm reports and this list lacks
// fails the fixture's "gaps" case by name.

using System.Collections.Generic;

namespace Dsm.DataStateMachine.Testing
{
    /// <summary>A property of the lifecycle that dsm verify judges.</summary>
    public sealed class DsmProperty
    {
        public DsmProperty(string name, string summary)
        {
            Name = name;
            Summary = summary;
        }

        public string Name { get; }
        public string Summary { get; }

        public override string ToString()
        {
            return Name;
        }
    }

    public static class DsmProperties
    {
        public static readonly IReadOnlyList<DsmProperty> All = new[]
        {
            new DsmProperty("at_most_one_live_lock", "no acquire succeeds while another lock is live"),
            new DsmProperty("acquire_agrees_with_model", "try_acquire_lock grants and refuses as the spec says"),
            new DsmProperty("exists_agrees_with_model", "exists is True only for Processed and Skipped"),
            new DsmProperty("stale_write_rejected", "a swept or taken-over holder's write raises StaleLockError"),
            new DsmProperty("spent_token_rejected", "a spent token (its own write landed) changes nothing: the same write again succeeds, any other raises StaleLockError"),
            new DsmProperty("errors_agree_with_model", "every refused call raises the error the spec names"),
            new DsmProperty("allowed_transitions_only", "every status change is in the transition table"),
            new DsmProperty("completion_releases_lock", "set and release_lock_as_failed end the lock"),
            new DsmProperty("data_round_trip", "the data read back is the data written"),
            new DsmProperty("record_agrees_with_model", "status, token and audit fields match the spec"),
            new DsmProperty("lock_duration_honoured", "locked_until is the acquire instant + lock duration"),
            new DsmProperty("timestamps_in_utc", "every stored instant is aware UTC from the injected clock"),
            new DsmProperty("upsert_keeps_history", "upsert over Processed keeps the old record as Superseded"),
            new DsmProperty("sweep_only_expired", "the lock sweep touches only Processing with locked_until < now"),
            new DsmProperty("sweep_resets_expired", "the lock sweep resets every expired lock to Failed"),
            new DsmProperty("retention_sweep_agrees_with_model", "the retention sweep expires what the spec says"),
            new DsmProperty("tenant_isolation", "no tenant sees or blocks another tenant's records"),
            new DsmProperty("scope_isolation", "no scope sees or blocks another scope's records"),
            new DsmProperty("entity_isolation", "no entity (node) or item entity key sees or blocks another's records"),
            new DsmProperty("key_identity", "distinct keys never share a record, lock or outcome; equal keys always do"),
            new DsmProperty("invalid_keys_refused", "keys the project refuses raise InvalidItemError before any store is touched"),
            new DsmProperty("closes_cleanly", "close() leaves no task running on the event loop"),
        };

        /// <summary>Whether this list has a case for <paramref name="name"/>.</summary>
        public static bool Known(string name)
        {
            foreach (var property in All)
            {
                if (property.Name == name) return true;
            }
            return false;
        }
    }
}
