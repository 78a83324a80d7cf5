"""The world reaches a handler in another process: each test case's time zone, and the peers.

The kit draws a time zone per test case.  A handler process (``--exec``)
is started per test case with that zone in ``TZ``, and its ``open`` names
it; its peers start in the same zone.  A handler server (``--exec-tcp``)
runs in the zone it was started in: the verdict says the zone was not
varied for it.  And the verdict says whether the races went through
several processes, and how many.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from dsm_sim.broken.exec_local_time import COMMAND as LOCAL_TIME
from dsm_sim.conformance.runner import verify
from dsm_sim.conformance.tell.outputs import junit_xml, report_dict
from dsm_sim.protocol.client import ExecFactory, exec_factory, tcp_factory
from reference_engine.clock import ManualClock

pytestmark = pytest.mark.integration

SERVED_MEMORY = [sys.executable, "-m", "dsm_sim.cli", "serve"]
MEMORY = "reference_engine.handlers.memory:in_memory_handler"

#: A handler whose open answers the TZ it runs in (as its name), and every open it was sent.
ZONE_ECHO = textwrap.dedent(
    """
    import json, os, sys
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "open":
            answer = {"protocol": 1, "concurrent": True, "name": os.environ.get("TZ", "")}
        else:
            answer = None
        print(json.dumps({"id": req["id"], "result": answer}), flush=True)
        if req["op"] == "close":
            break
    """
)


def _opens(factory: ExecFactory) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in factory.last_transcript]
    return [line for line in lines if line["op"] == "open"]


def test_a_handler_process_starts_in_its_zone_and_open_names_it(tmp_path: Path) -> None:
    script = tmp_path / "zone_echo.py"
    script.write_text(ZONE_ECHO, encoding="utf-8")
    factory = exec_factory([sys.executable, str(script)])

    async def opened_in(zone: str | None) -> str:
        handler = factory(ManualClock())
        handler.zone = zone
        await handler.open()
        try:
            return handler.name
        finally:
            await handler.close()

    try:
        for zone in ("IST-5:30", "HST10", "IST-5:30"):
            assert asyncio.run(opened_in(zone)) == zone
            assert _opens(factory)[0]["zone"] == zone
        # Spares are kept per zone: a process started for one waits for its zone.
        zones = {spare.env.get("TZ") for spare in factory._spares.spares}
        assert zones == {"IST-5:30", "HST10"}
        assert len(factory._spares.spares) <= factory._spares.LIMIT
    finally:
        factory._spares.discard()


def test_the_kit_runs_each_test_case_in_its_zone_out_of_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TZ", raising=False)
    factory = exec_factory([*SERVED_MEMORY, MEMORY])
    report = verify(factory, "dev", seed=3, probes=False, matrix=False)
    assert report.error is None and not report.violations, report.error
    # The last test case's processes: the first opens its store in the zone it drew, and
    # every peer opens the same store in the same zone.
    opens = _opens(factory)
    assert opens and all("zone" in line for line in opens)
    assert report.out_of_process and report.instances >= 1


#: Seed 0 on every pull request; the other two seeds, the same check where the kit draws other
#: zones, with the thorough tier.
@pytest.mark.parametrize(
    "seed", [0, *(pytest.param(seed, marks=pytest.mark.thorough) for seed in (1, 2))]
)
def test_a_handler_that_converts_through_local_time_is_caught(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No TZ set by hand: the kit's own zones reach the process.
    monkeypatch.delenv("TZ", raising=False)
    report = verify(exec_factory(LOCAL_TIME), "ci", seed=seed, stop_on_first=True)
    assert report.error is None, report.error
    assert report.violations, "a handler five hours off in New York passed"
    assert report.violations[0].time_zone not in (None, "UTC0")


def test_the_verdict_says_how_many_processes_raced(tmp_path: Path) -> None:
    # dsm serve of the in-memory handler names no store (no peers): one process.
    # What the verdict says of the races is the subject: the edge probes are left out.
    report = verify(
        exec_factory([*SERVED_MEMORY, MEMORY]), "dev", seed=0, max_examples=3, probes=False
    )
    assert report.out_of_process and report.instances == 1
    assert "through one process only" in report.races()
    data = report_dict(report)
    assert data["races"]["processes"] == 1 and not data["races"]["several_processes"]
    assert 'name="raced_processes" value="1"' in junit_xml(report)


def test_a_handler_server_is_not_said_to_have_run_in_every_zone() -> None:
    from handler_servers import dsm_serve_command, serving

    with serving(dsm_serve_command(MEMORY)) as address:
        # The time-zones gap is the subject: the edge probes are left out.
        report = verify(tcp_factory(address), "dev", seed=0, max_examples=3, probes=False)
        waived = verify(
            tcp_factory(address), "dev", seed=0, max_examples=3, probes=False, waive=["time-zones"]
        )
    assert not report.violations
    assert not report.passed
    assert any(line.startswith("NOT EXERCISED time-zones:") for line in report.not_exercised)
    assert "time-zones" not in waived.ignored_waivers
    assert not any("time-zones" in line for line in waived.not_exercised)
