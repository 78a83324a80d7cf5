"""The one Jinja environment every HTML page renders with (run reports, the index,
the demo, the kit's counterexample pages): the package's templates, escaped
for HTML, every variable required."""

from __future__ import annotations

import jinja2

__all__ = ["template_environment"]


def template_environment() -> jinja2.Environment:
    """The templates of ``dsm_sim/reports/templates``, HTML-escaped, strict about variables."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("dsm_sim.reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
