"""The one Jinja environment every HTML page renders with (run reports, the index,
the demo, the kit's counterexample pages): the package's templates, escaped
for HTML, every variable required, and a handler's control characters shown
as escapes."""

from __future__ import annotations

import jinja2
from markupsafe import Markup

from dsm_sim.printable import printable

__all__ = ["shown", "template_environment"]


def shown(value: object) -> object:
    """What a page prints for ``value``: as text, with control characters shown as escapes.

    A handler's message, a command line or a path may hold NUL, ESC or BEL,
    which HTML cannot carry and a browser may render as nothing, and lone
    surrogates (undecodable bytes), which UTF-8 cannot encode at all: each is
    written as its escape (``\\x1b``, ``\\udcff``), as on the terminal and in
    JUnit.  Markup the code built itself (the explorer's data and script) and
    numbers are left as they are.
    """
    if isinstance(value, Markup | bool | int | float) or value is None:
        return value
    return printable(str(value))


def template_environment() -> jinja2.Environment:
    """The templates of ``dsm_sim/reports/templates``, HTML-escaped, strict about variables."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("dsm_sim.reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        finalize=shown,
    )
