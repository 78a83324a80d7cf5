"""The explorer in a real browser: a seeded ``dsm run`` report and the demo page.

What the page shows is checked against what the run wrote to its JSON report
(and, for the demo, against the tables the terminal walk-through printed),
never against the page's own data: a bug in the precomputed arrays shows up
as a record or a state that disagrees with the history.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import itertools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dsm_sim import cli
from dsm_sim.micros import micros_of as us
from dsm_sim.reports.instants import wall

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
SCENARIO = HERE / "explorer-faults.toml"
SEED = 3
BROKEN = "broken:no_fencing"
IN_MEMORY = "reference_engine.handlers.memory:in_memory_handler"


# --- fixtures: one real run, one demo, each written once per module ---------------------------


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("report")
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(
            ["run", str(SCENARIO), "--seed", str(SEED), "--handler", BROKEN, "--report", str(out)]
        )
    assert code == 1, "the broken handler must be caught, or there is no violation to follow"
    (html,) = (page for page in out.glob("*.html") if page.name != "index.html")
    (report,) = out.glob("*.json")
    return html, json.loads(report.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("demo") / "demo.html"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(["demo", "invoice", "--handler", IN_MEMORY, "--html", str(path)])
    assert code == 0, printed.getvalue()
    return path, printed.getvalue()


# --- page helpers -----------------------------------------------------------------------------


def load(driver: Any, path: Path) -> None:
    driver.get(path.as_uri())
    driver.execute_script("return 1")
    assert driver.execute_script("return !!window.dsmExplorer"), "the explorer did not start"
    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors


def scrub_to(driver: Any, t: float) -> dict[str, Any]:
    """Drag the scrubber to the instant ``t`` (sets the range input as a pointer would)."""
    state: dict[str, Any] = driver.execute_script(
        "var s = document.getElementById('ex-scrub');"
        "s.value = String(window.dsmExplorer.stepOfTime(arguments[0]));"
        "s.dispatchEvent(new Event('input', {bubbles: true}));"
        "return window.dsmExplorer.state();",
        t,
    )
    assert state["t"] == pytest.approx(t, abs=1e-6)
    return state


def shown_records(driver: Any) -> dict[str, tuple[str, str]]:
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#ex-records tbody tr')).map("
        "function (r) { return [r.cells[0].textContent, r.cells[1].textContent,"
        " r.cells[2].textContent]; });"
    )
    return {key: (status, token) for key, status, token in rows}


def pin(driver: Any, key: str) -> None:
    """Click the item's row so the diagram follows it (clicking again lets go)."""
    driver.execute_script(
        "var rows = document.querySelectorAll('#ex-records tbody tr');"
        "for (var i = 0; i < rows.length; i++) {"
        " if (rows[i].cells[0].textContent === arguments[0]) { rows[i].click(); return; } }",
        key,
    )


def current_node(driver: Any) -> str:
    ids = driver.execute_script(
        "return Array.from(document.querySelectorAll('#ex-diagram .dg-node.current'))"
        ".map(function (g) { return g.id; });"
    )
    assert len(ids) == 1, ids
    return str(ids[0]).removeprefix("dg-n-")


# --- what the JSON says at an instant -----------------------------------------------------------


def expected_records(history: Mapping[str, Any], t: float) -> dict[str, dict[str, Any] | None]:
    """Each key's record after every call completed by ``t``: the reads around the calls,
    and for a lock sweep the keys it reports, which become Failed with no lock."""
    records: dict[str, dict[str, Any] | None] = {}
    done = [op for op in history["ops"] if op["complete"] is not None and op["complete"] <= t]
    for op in sorted(done, key=lambda o: o["complete"]):
        if op.get("probed") and op["key"]:
            records[op["key"]] = op["after"]
        elif op["op"] == "reset_expired_locks" and op["outcome"] != "fail":
            for key in op["keys"]:
                if records.get(key):
                    records[key] = {**records[key], "status": "failed", "locked_until": None}
    return records


def store_clock(history: Mapping[str, Any], t: float) -> float:
    jumps = [e for e in history["events"] if e["kind"] == "clock_jump" and e["time"] <= t]
    return t + sum(e["value"] for e in jumps)


def node_for(record: Mapping[str, Any] | None, now: float) -> str:
    if record is None:
        return "None"
    if record["status"] == "processing" and (record["locked_until"] or now) < now:
        return "ExpiredLock"
    return str(record["status"]).capitalize()


# --- the run report -------------------------------------------------------------------------------


def test_the_scrubbed_instant_shows_the_records_and_state_of_the_json(
    page: Any, run_report: tuple[Path, dict[str, Any]]
) -> None:
    html, report = run_report
    history = report["history"]
    load(page, html)
    ops = history["ops"]
    acquire = next(o for o in ops if o["op"] == "try_acquire_lock" and o["outcome"] == "ok")
    sweep = next(o for o in ops if o["op"] == "reset_expired_locks" and o["keys"])
    forbidden = next(
        v
        for inv in report["invariants"]
        if inv["name"] == "allowed_transitions_only"
        for v in inv["violations"]
    )
    bad = next(o for o in ops if o["index"] == forbidden["ops"][0])
    for op in (acquire, sweep, bad, ops[-1]):
        t = op["complete"]
        scrub_to(page, t)
        expected = expected_records(history, t)
        shown = shown_records(page)
        for key in history_keys(history):
            record = expected.get(key)
            want = (
                ("no record", "-") if record is None else (record["status"], str(record["attempt"]))
            )
            assert shown[key] == want, (t, key)
        for key in (op["keys"] or [op["key"]])[:2]:
            pin(page, key)
            assert page.execute_script("return window.dsmExplorer.state().key") == key
            assert current_node(page) == node_for(expected.get(key), store_clock(history, t))
            pin(page, key)
    # The forbidden change is drawn as one: the diagram has no edge for it.
    scrub_to(page, bad["complete"])
    pin(page, bad["key"])
    text = page.find_element("id", "ex-dg-edge").text
    assert "Failed \u2192 Processed" in text and "NOT in the transition table" in text
    pin(page, bad["key"])
    # An allowed one is highlighted on its edge.
    scrub_to(page, acquire["complete"])
    pin(page, acquire["key"])
    last = page.execute_script(
        "return Array.from(document.querySelectorAll('#ex-diagram .dg-edge.last'))"
        ".map(function (p) { return p.id; });"
    )
    assert last in (
        ["dg-e-None-Processing"],
        ["dg-e-ExpiredLock-Processing"],
        ["dg-e-Failed-Processing"],
    )
    pin(page, acquire["key"])


def history_keys(history: Mapping[str, Any]) -> list[str]:
    found = {o["key"] for o in history["ops"] if o["key"]}
    found |= {e["key"] for e in history["events"] if e["key"]}
    found |= {f["key"] for f in history["final"]}
    return sorted(found)


def test_clicking_an_operation_shows_request_response_and_records(
    page: Any, run_report: tuple[Path, dict[str, Any]]
) -> None:
    html, report = run_report
    load(page, html)
    op = next(
        o for o in report["history"]["ops"] if o["op"] == "set" and o.get("probed") and o["after"]
    )
    scrub_to(page, op["complete"])
    page.find_element("css selector", f'#ex-lanes rect.op[data-op="{op["index"]}"]').click()
    detail = page.find_element("id", "ex-detail")
    assert page.find_element("id", "ex-op-title").text == f"Operation #{op['index']} set"
    assert page.find_element("id", "ex-op-outcome").text == op["outcome"]
    assert f"target status {op['status']}" in detail.text
    assert f"token {op['token']}" in detail.text
    before = page.find_element("id", "ex-op-before").text
    after = page.find_element("id", "ex-op-after").text
    want_before = "no record" if op["before"] is None else f"status {op['before']['status']}"
    assert want_before in before
    assert f"status {op['after']['status']}" in after
    assert f"token (attempt) {op['after']['attempt']}" in after


def test_a_violation_jumps_to_its_trace_and_plays_it(
    page: Any, run_report: tuple[Path, dict[str, Any]]
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    html, report = run_report
    load(page, html)
    violation = next(v for inv in report["invariants"] for v in inv["violations"])
    by_index = {o["index"]: o for o in report["history"]["ops"]}
    steps = sorted(
        [(by_index[i]["complete"], i) for i in violation["ops"]]
        + [
            (e["time"], -1)
            for e in report["history"]["events"]
            if e["index"] in violation["events"]
        ]
    )
    page.find_elements("css selector", "button.ex-follow")[0].click()
    trace = page.find_element("id", "ex-trace")
    assert trace.is_displayed()
    assert violation["message"] in page.find_element("id", "ex-trace-title").text
    assert page.find_element("id", "ex-trace-pos").text == f"step 1 of {len(steps)}"
    assert page.execute_script("return window.dsmExplorer.state()")["key"] == violation["key"]
    first_t, first_op = steps[0]
    assert page.execute_script("return window.dsmExplorer.state().t") == pytest.approx(first_t)
    if first_op >= 0:
        assert page.find_element("id", "ex-detail").get_attribute("data-op") == str(first_op)
    if len(steps) > 1:
        page.find_element("id", "ex-trace-next").click()
        assert page.find_element("id", "ex-trace-pos").text == f"step 2 of {len(steps)}"
        assert page.execute_script("return window.dsmExplorer.state().t") == pytest.approx(
            steps[1][0]
        )
    page.find_element("id", "ex-trace-play").click()
    WebDriverWait(page, 2 + len(steps)).until(
        lambda d: d.find_element("id", "ex-trace-pos").text == f"step {len(steps)} of {len(steps)}"
    )
    assert page.execute_script("return window.dsmExplorer.state().t") == pytest.approx(steps[-1][0])
    page.find_element("id", "ex-trace-close").click()
    assert not trace.is_displayed()
    # A row of the static violating trace opens its operation at its instant.
    cited = page.find_elements("css selector", "tr.bad[data-op]")[0]
    op = by_index[int(cited.get_attribute("data-op"))]
    page.execute_script("arguments[0].click()", cited)
    assert page.find_element("id", "ex-detail").get_attribute("data-op") == str(op["index"])
    assert page.execute_script("return window.dsmExplorer.state().t") == pytest.approx(
        op["complete"]
    )


def test_the_keyboard_moves_the_scrubber_and_opens_operations(
    page: Any, run_report: tuple[Path, dict[str, Any]]
) -> None:
    from selenium.webdriver.common.keys import Keys

    html, report = run_report
    load(page, html)
    page.execute_script("document.getElementById('ex-prev').focus()")
    page.switch_to.active_element.send_keys(Keys.TAB)
    scrub = page.switch_to.active_element
    assert scrub.get_attribute("id") == "ex-scrub"
    outline = page.execute_script("return getComputedStyle(arguments[0]).outlineStyle", scrub)
    assert outline not in ("", "none"), "keyboard focus must be visible"
    scrub.send_keys(Keys.HOME, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
    assert page.execute_script("return window.dsmExplorer.state().step") == 3
    scrub.send_keys(Keys.SHIFT, Keys.ARROW_RIGHT)
    assert page.execute_script("return window.dsmExplorer.state().step") == 13
    scrub.send_keys(Keys.ARROW_LEFT)
    assert page.execute_script("return window.dsmExplorer.state().step") == 12
    scrub.send_keys(Keys.ENTER)
    active = page.switch_to.active_element
    assert active.get_attribute("id") == "ex-detail"
    t = page.execute_script("return window.dsmExplorer.state().t")
    opened = int(active.get_attribute("data-op"))
    op = next(o for o in report["history"]["ops"] if o["index"] == opened)
    assert t in (pytest.approx(op["invoke"]), pytest.approx(op["complete"])) or (
        op["invoke"] <= t <= op["complete"]
    )
    # An operation in a lane takes focus and opens with Enter.
    rect = page.find_elements("css selector", "#ex-lanes rect.op")[0]
    page.execute_script("arguments[0].focus()", rect)
    want = rect.get_attribute("data-op")
    page.switch_to.active_element.send_keys(Keys.ENTER)
    assert page.find_element("id", "ex-detail").get_attribute("data-op") == want
    # Away from the scrubber the arrow keys still step the run.
    before = page.execute_script("return window.dsmExplorer.state().step")
    page.find_element("tag name", "body").send_keys(Keys.ARROW_RIGHT)
    assert page.execute_script("return window.dsmExplorer.state().step") == before + 1


def test_faults_are_marked_listed_and_jump_to_their_instant(
    page: Any, run_report: tuple[Path, dict[str, Any]]
) -> None:
    html, report = run_report
    history = report["history"]
    load(page, html)
    kinds = {"crash", "clock_jump", "catchup_pause", "catchup_resume", "faults_stop"}
    events = [e for e in history["events"] if e["kind"] in kinds]
    store_errors = [o for o in history["ops"] if o["error"] == "StoreError"]
    assert store_errors and any(e["kind"] == "crash" for e in events), "the run must have faults"
    listed = page.execute_script(
        "return Array.from(document.querySelectorAll('#faults tr.fault'))"
        ".map(function (r) { return [r.dataset.kind, +r.dataset.t]; });"
    )
    want = sorted(
        [(e["kind"], round(e["time"], 6)) for e in events]
        + [("store_error", round(o["complete"], 6)) for o in store_errors]
    )
    assert sorted((k, round(t, 6)) for k, t in listed) == want
    # One time axis on the page: the run's swim lanes, with every fault marked on it.
    assert page.find_element("id", "timeline").is_displayed()
    assert not page.find_element("id", "ex-overview").is_displayed()
    marks = page.execute_script("return document.querySelectorAll('#timeline line.fault').length")
    assert marks == len(want)
    jump = next(e for e in events if e["kind"] == "clock_jump")
    page.execute_script(
        "document.querySelector('#faults tr.fault[data-kind=\"clock_jump\"]').click()"
    )
    assert page.execute_script("return window.dsmExplorer.state().t") == pytest.approx(jump["time"])
    shown = page.find_element("id", "ex-time").text
    epoch = dt.datetime.fromisoformat(history["epoch"])
    assert f": {wall(epoch, us(jump['time']))}" in shown
    assert f"(store clock {wall(epoch, us(jump['time'] + jump['value']))})" in shown
    # The cursor stands on the axis at that instant, inside the window the lanes show.
    cursor = page.execute_script(
        "var c = document.getElementById('ex-ov-cursor'), b = document.querySelector('#timeline .ex-window');"
        "return [+c.getAttribute('x1'), +b.getAttribute('x'), +b.getAttribute('width'),"
        " +document.getElementById('timeline').dataset.left,"
        " +document.getElementById('timeline').dataset.scale];"
    )
    x, band_x, band_w, left, scale = cursor
    assert x == pytest.approx(left + jump["time"] * scale, abs=0.1)
    assert band_x <= x <= band_x + band_w


def test_without_javascript_the_static_report_remains(
    page: Any, run_report: tuple[Path, dict[str, Any]]
) -> None:
    html, _ = run_report
    text = html.read_text(encoding="utf-8")
    assert re.search(r"<script[^>]*\bsrc=", text) is None
    assert "https://" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    page.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        page.get(html.as_uri())
        assert not page.find_element("id", "explorer").is_displayed()
        body = page.find_element("tag name", "body").text
        for heading in (
            "Invariants",
            "Timeline",
            "Violating trace",
            "Faults on the timeline",
            "Final records",
        ):
            assert heading in body
    finally:
        page.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})


# --- the demo page ------------------------------------------------------------------------------


def printed_tables(text: str) -> dict[str, dict[str, tuple[str, str]]]:
    """The last records table each ``Step N.`` of the terminal walk-through printed."""
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    for chunk in re.split(r"\n(?=Step \d+\. )", text)[1:]:
        title = chunk.splitlines()[0]
        blocks = chunk.split("records, read back with get():")
        if len(blocks) < 2:
            continue
        rows: dict[str, tuple[str, str]] = {}
        for line in blocks[-1].splitlines()[3:]:
            words = line.split()
            if not words or not words[0].startswith("INV-"):
                break
            rows[words[0]] = (words[1], words[2])
        tables[title] = rows
    return tables


def test_the_demo_page_agrees_with_the_terminal_walk_through(
    page: Any, demo_page: tuple[Path, str]
) -> None:
    from selenium.webdriver.common.keys import Keys

    path, printed = demo_page
    assert "All narrated claims held." in printed
    load(page, path)
    assert page.find_element("id", "walk-through").text.strip() == printed.strip()
    tables = printed_tables(printed)
    assert len(tables) >= 5
    scrub = page.find_element("id", "ex-scrub")
    page.execute_script("arguments[0].focus()", scrub)
    scrub.send_keys(Keys.HOME)
    last = int(scrub.get_attribute("max"))
    seen: dict[str, dict[str, tuple[str, str]]] = {}
    clocks: dict[str, set[str]] = {}
    for _ in range(last + 1):
        title = page.find_element("css selector", "#ex-narration h3").text
        seen[title] = {
            key.rsplit("/", 1)[-1]: (status.upper(), token)
            for key, (status, token) in shown_records(page).items()
            if status != "no record"
        }
        # The instant is the demo's clock, as the narration says it; no step is marked.
        clocks.setdefault(title, set()).add(page.find_element("id", "ex-time").text.split(": ")[1])
        assert "NOT in the transition table" not in page.find_element("id", "ex-dg-edge").text
        scrub.send_keys(Keys.ARROW_RIGHT)
    for title, shown in clocks.items():
        step = printed.split(title, 1)[1].split("\nStep ", 1)[0]
        narrated = set(re.findall(r"\[clock (\d\d:\d\d:\d\d)\]", step))
        assert shown <= narrated | {"09:00:00"}, (title, shown, narrated)
    # Its one time axis: the explorer's own, labelled with the page's evenly spaced ticks.
    assert page.find_element("id", "ex-overview").is_displayed()
    labels = page.execute_script(
        "return Array.from(document.querySelectorAll('#ex-overview text.tick'))"
        ".map(function (t) { return [+t.getAttribute('x'), t.textContent]; });"
    )
    assert [label for _, label in labels][:3] == ["09:00:00", "09:05:00", "09:10:00"]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(labels)]
    assert max(gaps) - min(gaps) < 0.2
    compared = [title for title in tables if title in seen]
    assert len(compared) >= 5, (list(tables), list(seen))
    for title in compared:
        want = {
            item: (status.upper(), attempt) for item, (status, attempt) in tables[title].items()
        }
        assert seen[title] == want, title
    # The end of the run: both invoices Processed, INV-1002 on its second attempt.
    assert seen[compared[-1]] == {"INV-1001": ("PROCESSED", "1"), "INV-1002": ("PROCESSED", "2")}
    key = next(k for k in shown_records(page) if k.endswith("INV-1002"))
    pin(page, key)
    assert current_node(page) == "Processed"
    # The crash leaves a Processing lock that the sweep, once it lapsed, resets to Failed.
    crash = page.execute_script(
        "return +document.querySelector('#faults tr.fault[data-kind=\"crash\"]').dataset.t"
    )
    scrub_to(page, crash)
    assert current_node(page) == "Processing"
    data = json.loads(
        page.execute_script("return document.getElementById('dsm-explorer-data').textContent")
    )
    names = data["op_names"]
    sweep_row = next(
        i for i, n in enumerate(data["ops"]["op"]) if names[n] == "reset_expired_locks"
    )
    scrub_to(page, data["ops"]["t1"][sweep_row])
    assert current_node(page) == "Failed"
    assert page.execute_script("return window.dsmExplorer.state().edge") == "ExpiredLock>Failed"
    # The stale writer's set is refused and changes nothing.
    stale = next(
        i
        for i, d in enumerate(data["ops"]["detail"])
        if d[2] >= 0 and data["strings"][d[2]] == "StaleLockError"
    )
    scrub_to(page, data["ops"]["t1"][stale])
    page.find_element(
        "css selector", f'#ex-lanes rect.op[data-op="{data["ops"]["index"][stale]}"]'
    ).click()
    assert page.find_element("id", "ex-op-error").text == "StaleLockError"
    for side in ("ex-op-before", "ex-op-after"):
        text = page.find_element("id", side).text
        assert "status processed" in text and "token (attempt) 2" in text
    pin(page, key)
