"""The explorer on a large run, in a real browser: time to first render and per scrub step.

``python bench/bench_explorer.py [--items 250] [--lines 6] [--seed 1]`` runs
the browser tests' fault scenario with an invoice node and a screening node
(``--lines`` lines per message), about 10^4 handler calls by default, writes
its report, opens it in headless Chromium (Debian's
``chromium`` and ``/usr/bin/chromedriver``) and prints what the page measured
with ``performance.now()``: parsing the inline data and the first render,
and the mean and worst of a scrub step (to random instants, and one instant
forward).  The figures go to ``docs/performance.md``; nothing is asserted.

Not part of ``bench/run.py``: a browser is not a dependency of the other
benchmarks, and CI's browser tests already open a report.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from dsm_sim import cli

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "browser" / "explorer-faults.toml"

_SCRUB = """
var x = window.dsmExplorer, n = +document.getElementById('ex-scrub').max + 1, worst = 0, total = 0;
var seed = 7; function rnd() { seed = (seed * 16807) % 2147483647; return seed / 2147483647; }
for (var i = 0; i < arguments[0]; i++) {
  var a = performance.now(); x.goto(Math.floor(rnd() * n)); var d = performance.now() - a;
  total += d; worst = Math.max(worst, d);
}
var fw = 0, fworst = 0; x.goto(Math.floor(n / 2));
for (var j = 0; j < arguments[0]; j++) {
  var b = performance.now(); x.goto(x.state().step + 1); var e = performance.now() - b;
  fw += e; fworst = Math.max(fworst, e);
}
return {random_mean: total / arguments[0], random_worst: worst,
        step_mean: fw / arguments[0], step_worst: fworst, instants: n,
        drawn: +document.getElementById('ex-lanes').dataset.drawn};
"""


def large_scenario(directory: Path, items: int, lines: int) -> Path:
    text = SCENARIO.read_text(encoding="utf-8")
    for key, value in {
        "name": '"explorer-large"',
        "items": str(items),
        "workers": "16",
        "arrival_window": '"600s"',
        "faults_until": '"10m"',
    }.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text, count=1)
    text += (
        '\n[[nodes]]\nid = "billing"\nkind = "invoice"\nscope = "Element"\n'
        f'\n[[nodes]]\nid = "screening"\nkind = "screening"\nscope = "Element"\nlines = {lines}\n'
    )
    path = directory / "explorer-large.toml"
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/bench_explorer.py", description=__doc__)
    parser.add_argument("--items", type=int, default=250)
    parser.add_argument("--lines", type=int, default=6, help="lines per screening message")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="dsm-bench-explorer-"))
    try:
        scenario = large_scenario(directory, args.items, args.lines)
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(["run", str(scenario), "--seed", str(args.seed), "--report", str(directory)])
        (html,) = (page for page in directory.glob("*.html") if page.name != "index.html")
        (report,) = directory.glob("*.json")
        history = json.loads(report.read_text(encoding="utf-8"))["history"]
        options = Options()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            driver.get(html.as_uri())
            load = driver.execute_script(
                "var n = performance.getEntriesByType('navigation')[0];"
                "return {first_render: window.dsmExplorer.firstRenderMs,"
                " dom_content_loaded: n.domContentLoadedEventEnd, load: n.loadEventEnd};"
            )
            scrub = driver.execute_script(_SCRUB, args.steps)
        finally:
            driver.quit()
        print(
            f"report: {len(history['ops'])} operations, {len(history['events'])} events, "
            f"{html.stat().st_size / 1e6:.1f} MB of HTML, {scrub['instants']} instants"
        )
        print(
            f"explorer script (parse data + precompute + first render): {load['first_render']:.0f} ms"
        )
        print(
            f"page DOMContentLoaded: {load['dom_content_loaded']:.0f} ms, load: {load['load']:.0f} ms"
        )
        print(
            f"scrub to a random instant: mean {scrub['random_mean']:.1f} ms, "
            f"worst {scrub['random_worst']:.1f} ms ({args.steps} steps)"
        )
        print(
            f"scrub one instant forward: mean {scrub['step_mean']:.1f} ms, "
            f"worst {scrub['step_worst']:.1f} ms; {scrub['drawn']} operations drawn in the window"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
