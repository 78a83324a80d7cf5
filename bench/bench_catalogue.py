"""Time and examples the conformance kit needs to catch each handler of the catalogue.

The baseline is the correct in-memory handler verified with the same
profile and seed: the time a clean pass costs.  A broken handler caught in a
small fraction of that time is cheap to catch; one caught only near the end
of the budget is a sign the properties barely reach it.
"""

from __future__ import annotations

from common import BenchSkipped, Table, timed

__all__ = ["TITLE", "run"]

TITLE = "Conformance kit: time and examples to catch each broken handler"
HEADERS = (
    "handler",
    "caught",
    "property",
    "examples",
    "story steps",
    "seconds to catch",
    "clean pass seconds",
    "catch/clean",
)
SEED = 0
#: The short (CI) mode only proves the benchmark runs: a few entries the kit catches fast.
SHORT_ENTRIES = ("check_then_insert_acquire", "tenant_missing_from_key", "local_time_not_utc")


def _story_steps(story: str) -> int:
    """Numbered steps of a story (the zone line and the verdict are not steps)."""
    return sum(1 for line in story.splitlines() if line[:5].strip().rstrip(".").isdigit())


def run(short: bool) -> list[Table]:
    try:
        from dsm_sim.broken import CATALOGUE
        from dsm_sim.conformance.runner import verify
    except ImportError as exc:
        raise BenchSkipped(f"the catalogue or the conformance runner is missing: {exc}") from exc
    from reference_engine.handlers.memory import in_memory_handler

    profile = "dev" if short else "ci"
    started = timed()
    clean = verify(in_memory_handler, profile, SEED)
    clean_seconds = timed() - started
    rows: list[tuple[object, ...]] = []
    entries = [(n, s) for n, s in CATALOGUE.items() if not short or n in SHORT_ENTRIES]
    for name, spec in entries:
        started = timed()
        report = verify(spec.factory, profile, SEED, stop_on_first=True)
        seconds = timed() - started
        first = report.violations[0] if report.violations else None
        rows.append(
            (
                name,
                "yes" if first is not None else "NO",
                "-" if first is None else first.name,
                "-"
                if first is None or first.examples_to_failure is None
                else first.examples_to_failure,
                "-" if first is None else _story_steps(first.story),
                seconds,
                clean_seconds,
                seconds / clean_seconds if clean_seconds > 0 else "-",
            )
        )
    verdict = "passes" if clean.passed else "FAILS"
    times = sorted(float(row[5]) for row in rows)  # type: ignore[arg-type]
    median = times[len(times) // 2] if times else 0.0
    caught = sum(1 for row in rows if row[1] == "yes")
    note = (
        f"profile {profile}, seed {SEED}, {len(entries)} of {len(CATALOGUE)} entries, "
        f"{caught} caught; median {median:.1f}s, max {max(times, default=0.0):.1f}s to catch; "
        f"the in-memory handler {verdict} the clean run"
    )
    return [Table(TITLE, HEADERS, rows, note)]
