"""The catalogue of deliberately broken handlers.

The conformance kit is only as good as the bugs it catches, so it ships the
bugs: each entry is a handler with one realistic defect, a sentence saying
what it is, and the properties expected to catch it.  The kit's own tests
verify every entry is caught; the simulator replays them as chaos targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dsm_sim.broken import blame as _b
from dsm_sim.broken import dimensions as _d
from dsm_sim.broken import domain as _x
from dsm_sim.broken import handlers as _h
from dsm_sim.broken import instances as _i
from dsm_sim.broken import keys as _k
from dsm_sim.broken import lifecycle as _l
from dsm_sim.broken import payloads as _p
from dsm_sim.broken import spawned as _s
from dsm_sim.broken import timing as _t
from dsm_sim.broken import transactions as _tx
from dsm_sim.broken import writes as _w
from reference_engine.handler import HandlerFactory
from reference_engine.handlers.memory import InMemoryStateHandler

__all__ = ["CATALOGUE", "BrokenHandlerSpec"]


@dataclass(frozen=True, slots=True)
class BrokenHandlerSpec:
    """One entry: the handler, its bug in one sentence, and what must catch it."""

    name: str
    bug: str
    factory: HandlerFactory
    expected_properties: tuple[str, ...]


def _spec(
    name: str, cls: type[InMemoryStateHandler], *expected: str
) -> tuple[str, BrokenHandlerSpec]:
    bug = (cls.__doc__ or name).strip().splitlines()[0]
    # The class itself is the factory: it takes the clock, and its dotted path
    # (dsm_sim.broken.handlers:Name) is what reproductions import.
    return name, BrokenHandlerSpec(name, bug, cls, tuple(expected))


CATALOGUE: Mapping[str, BrokenHandlerSpec] = MappingProxyType(
    dict(
        [
            _spec(
                "check_then_insert_acquire",
                _h.CheckThenInsertAcquire,
                "at_most_one_live_lock",
                # Its write puts back the record it read, over a write that came between.
                "allowed_transitions_only",
            ),
            _spec("acquire_over_processed", _h.AcquireOverProcessed, "allowed_transitions_only"),
            _spec("sweep_ignores_locked_until", _h.SweepIgnoresLockedUntil, "sweep_only_expired"),
            _spec("inclusive_lock_boundary", _h.InclusiveLockBoundary, "at_most_one_live_lock"),
            _spec(
                "inclusive_retention_boundary",
                _h.InclusiveRetentionBoundary,
                "retention_sweep_agrees_with_model",
            ),
            _spec(
                "expires_without_retention",
                _h.ExpiresWithoutRetention,
                "retention_sweep_agrees_with_model",
            ),
            _spec("set_keeps_lock", _h.SetKeepsLock, "completion_releases_lock"),
            _spec(
                "release_keeps_lock",
                _h.ReleaseKeepsLock,
                "completion_releases_lock",
                # The lock it keeps still honours the token the release spent.
                "stale_write_rejected",
            ),
            _spec("exists_true_for_failed", _h.ExistsTrueForFailed, "exists_agrees_with_model"),
            _spec(
                "exists_true_for_processing", _h.ExistsTrueForProcessing, "exists_agrees_with_model"
            ),
            _spec("upsert_overwrites_in_place", _h.UpsertOverwritesInPlace, "upsert_keeps_history"),
            _spec("tenant_missing_from_key", _h.TenantMissingFromKey, "tenant_isolation"),
            _spec("scope_missing_from_key", _h.ScopeMissingFromKey, "scope_isolation"),
            _spec("entity_missing_from_key", _h.EntityMissingFromKey, "entity_isolation"),
            _spec(
                "lock_duration_in_milliseconds",
                _h.LockDurationInMilliseconds,
                "lock_duration_honoured",
            ),
            _spec("local_time_not_utc", _h.LocalTimeNotUtc, "timestamps_in_utc"),
            _spec("no_fencing", _h.NoFencing, "stale_write_rejected", "spent_token_rejected"),
            _spec("expired_not_retryable", _h.ExpiredNotRetryable, "acquire_agrees_with_model"),
            _spec("set_without_data_clears_data", _h.SetWithoutDataClearsData, "data_round_trip"),
            _spec(
                "token_not_incremented",
                _h.TokenNotIncremented,
                "acquire_agrees_with_model",
                "stale_write_rejected",
            ),
            # Keys a store changes on the way.
            _spec("strips_keys", _k.StripsKeys, "key_identity"),
            _spec("case_insensitive_keys", _k.CaseInsensitiveKeys, "key_identity"),
            _spec("normalises_unicode_keys", _k.NormalisesUnicodeKeys, "key_identity"),
            _spec("truncates_long_keys", _k.TruncatesLongKeys, "key_identity"),
            _spec(
                "joins_key_parts_with_colon",
                _k.JoinsKeyPartsWithColon,
                "key_identity",
                # The parts it runs together may be two entities' (flow7 + x:line, flow7:x + line).
                "entity_isolation",
            ),
            _spec("tenant_case_folded", _k.TenantCaseFolded, "tenant_isolation"),
            # Durations, boundaries and time zones.
            _spec(
                "ignores_configured_lock_duration",
                _t.IgnoresConfiguredLockDuration,
                "lock_duration_honoured",
            ),
            _spec(
                "first_node_options_for_all",
                _t.FirstNodeOptionsForAll,
                "lock_duration_honoured",
                "record_agrees_with_model",
            ),
            _spec(
                "sweeps_on_updated_at",
                _t.SweepsOnUpdatedAt,
                "sweep_resets_expired",
                "sweep_only_expired",
            ),
            _spec(
                "retention_from_created_at",
                _t.RetentionFromCreatedAt,
                "record_agrees_with_model",
                "retention_sweep_agrees_with_model",
            ),
            _spec(
                "naive_local_expiry",
                _t.NaiveLocalExpiry,
                "timestamps_in_utc",
                "lock_duration_honoured",
            ),
            _spec(
                "acquire_rereads_clock",
                _t.AcquireRereadsClock,
                "acquire_agrees_with_model",
                "at_most_one_live_lock",
                "lock_duration_honoured",
                # The second reading stamps the record's instants.
                "record_agrees_with_model",
            ),
            # Fencing under spent tokens and executions; check and write apart.
            _spec(
                "fencing_ignores_status",
                _w.FencingIgnoresStatus,
                "spent_token_rejected",
                "stale_write_rejected",
                # A stale write that lands also leaves the record off the model.
                "record_agrees_with_model",
            ),
            _spec(
                "fencing_by_execution_id",
                _w.FencingByExecutionId,
                "stale_write_rejected",
                "spent_token_rejected",
                # A stale write that lands also leaves the record off the model.
                "record_agrees_with_model",
            ),
            _spec(
                "completion_reads_then_writes",
                _w.CompletionReadsThenWrites,
                "stale_write_rejected",
                # A stale write that lands also leaves the record off the model.
                "record_agrees_with_model",
            ),
            _spec(
                "release_reads_then_writes",
                _w.ReleaseReadsThenWrites,
                "stale_write_rejected",
                "at_most_one_live_lock",
                # A stale write that lands also leaves the record off the model.
                "record_agrees_with_model",
            ),
            _spec(
                "retention_sweep_selects_then_updates",
                _w.RetentionSweepSelectsThenUpdates,
                "retention_sweep_agrees_with_model",
                "allowed_transitions_only",
                "record_agrees_with_model",
            ),
            _spec(
                "retention_sweep_keeps_version",
                _w.RetentionSweepKeepsVersion,
                "stale_write_rejected",
                # A write over the swept record also leaves it off the model.
                "record_agrees_with_model",
            ),
            # The same races with their body in a task the handler starts itself,
            # and a race whose window lies deep inside a call (not at its first await).
            _spec(
                "acquire_in_child_task",
                _s.AcquireInChildTask,
                "at_most_one_live_lock",
                "allowed_transitions_only",
            ),
            _spec(
                "upsert_shielded",
                _s.UpsertShielded,
                "errors_agree_with_model",
                "record_agrees_with_model",
                "at_most_one_live_lock",
                "acquire_agrees_with_model",
                "allowed_transitions_only",
            ),
            _spec(
                "completion_under_wait_for",
                _s.CompletionUnderWaitFor,
                "stale_write_rejected",
                "record_agrees_with_model",
            ),
            _spec(
                "release_in_gather",
                _s.ReleaseInGather,
                "stale_write_rejected",
                "at_most_one_live_lock",
                "record_agrees_with_model",
            ),
            _spec(
                "status_compare_and_set_acquire",
                _tx.StatusCompareAndSetAcquire,
                "at_most_one_live_lock",
                "acquire_agrees_with_model",
            ),
            _spec(
                "upsert_checks_then_writes",
                _w.UpsertChecksThenWrites,
                "errors_agree_with_model",
                # Its write lands on the record as it was read, stamps and all.
                "record_agrees_with_model",
                "at_most_one_live_lock",
                "acquire_agrees_with_model",
                # An upsert that writes over a lock taken in between leaves an
                # acquire over Processed, outside the table.
                "allowed_transitions_only",
            ),
            # Payloads and details outside the tiny domain.
            _spec("numbers_as_doubles", _p.NumbersAsDoubles, "data_round_trip"),
            _spec(
                "floats_to_fifteen_digits",
                _p.FloatsToFifteenDigits,
                "data_round_trip",
                "errors_agree_with_model",
            ),
            _spec("jsonb_refuses_nul", _p.JsonbRefusesNul, "errors_agree_with_model"),
            _spec(
                "error_detail_truncated_in_bytes",
                _p.ErrorDetailTruncatedInBytes,
                "record_agrees_with_model",
            ),
            # Empty values, the whole number range, blank and padded details.
            _spec("drops_empty_values", _p.DropsEmptyValues, "data_round_trip"),
            _spec(
                "integers_clamped_to_decimal65",
                _p.IntegersClampedToDecimal65,
                "data_round_trip",
            ),
            _spec("error_detail_trimmed", _p.ErrorDetailTrimmed, "record_agrees_with_model"),
            # Near keys across character classes; identifiers at their maximum length.
            _spec("accent_insensitive_keys", _k.AccentInsensitiveKeys, "key_identity"),
            _spec(
                "entity_id_truncated",
                _k.EntityIdTruncated,
                "entity_isolation",
                # Read first through a fresh item's key, the record is another key's.
                "key_identity",
            ),
            # Sub-second and day-long locks; retention past 2038.
            _spec("lock_rounded_to_seconds", _t.LockRoundedToSeconds, "lock_duration_honoured"),
            _spec(
                "retention_as_int32_seconds",
                _t.RetentionAsInt32Seconds,
                "record_agrees_with_model",
                "retention_sweep_agrees_with_model",
            ),
            # Objects kept after the call, source apps per worker, restarts.
            _spec("get_returns_cached_data", _l.GetReturnsCachedData, "data_round_trip"),
            _spec("source_app_from_insert", _l.SourceAppFromInsert, "record_agrees_with_model"),
            _spec(
                "close_releases_locks",
                _l.CloseReleasesLocks,
                "record_agrees_with_model",
                "allowed_transitions_only",
            ),
            # Safety kept in the instance: caught only through one instance per worker.
            _spec("instance_locked_acquire", _i.InstanceLockedAcquire, "at_most_one_live_lock"),
            # Dimensions a world that stands still never moves: redeploys, long
            # histories, a read raced by a write, keys at their limits in bytes,
            # midnight, tenants that never acquire.
            _spec(
                "keeps_first_lock_duration",
                _d.KeepsFirstLockDuration,
                "lock_duration_honoured",
                "record_agrees_with_model",
                "at_most_one_live_lock",
                "acquire_agrees_with_model",
            ),
            _spec(
                "history_sweep_pages_newest",
                _d.HistorySweepPagesNewest,
                "retention_sweep_agrees_with_model",
            ),
            _spec(
                "get_reads_payload_apart",
                _d.GetReadsPayloadApart,
                "record_agrees_with_model",
                "data_round_trip",
                "completion_releases_lock",
            ),
            _spec("keys_limited_in_bytes", _d.KeysLimitedInBytes, "errors_agree_with_model"),
            _spec(
                "lock_wraps_at_midnight",
                _d.LockWrapsAtMidnight,
                "lock_duration_honoured",
                "at_most_one_live_lock",
                "record_agrees_with_model",
            ),
            _spec(
                "sweep_skips_tenants_never_acquired",
                _d.SweepSkipsTenantsNeverAcquired,
                "retention_sweep_agrees_with_model",
            ),
            # The whole JSON domain, text with every line ending, long histories,
            # keys whose hashes collide: what tidy names and short runs never show.
            _spec("payload_merged_into_record", _x.PayloadMergedIntoRecord, "data_round_trip"),
            _spec("parses_json_looking_text", _x.ParsesJsonLookingText, "data_round_trip"),
            _spec("error_detail_crlf_to_lf", _x.ErrorDetailCrlfToLf, "record_agrees_with_model"),
            _spec(
                "token_compared_as_text",
                _x.TokenComparedAsText,
                "stale_write_rejected",
                # The late write that lands leaves the record off the model too.
                "record_agrees_with_model",
            ),
            _spec(
                "hash_placed_keys",
                _x.HashPlacedKeys,
                "key_identity",
                "tenant_isolation",
                "entity_isolation",
            ),
            # A later call shows the bug: the story must blame the call that made it.
            _spec(
                "retention_counts_current_only",
                _b.RetentionCountsCurrentOnly,
                "retention_sweep_agrees_with_model",
            ),
            _spec(
                "completion_lost_on_expired_lock",
                _b.CompletionLostOnExpiredLock,
                "completion_releases_lock",
            ),
            _spec("open_fails_live_locks", _b.OpenFailsLiveLocks, "record_agrees_with_model"),
        ]
    )
)
