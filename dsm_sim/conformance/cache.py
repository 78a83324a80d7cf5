"""Where ``dsm verify`` lets Hypothesis keep its files, away from the user's working directory.

Hypothesis writes a ``.hypothesis/`` folder in the current directory even with
its example database off (its unicode tables for ``st.text()`` live there).
Running a verification must not litter the project it was run from, so the
kit points Hypothesis at a cache directory: ``--cache-dir``, else
``DSM_CACHE_DIR``, else the user cache directory (``$XDG_CACHE_HOME/dsm``,
``~/.cache/dsm``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CACHE_DIR_ENV", "cache_dir", "use_cache_dir"]

CACHE_DIR_ENV = "DSM_CACHE_DIR"


def cache_dir(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The directory the kit's Hypothesis files go to; see the module docstring for the order."""
    environ = os.environ if env is None else env
    if explicit is not None and str(explicit).strip():
        return Path(explicit).expanduser()
    if chosen := environ.get(CACHE_DIR_ENV, "").strip():
        return Path(chosen).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "dsm"


def use_cache_dir(directory: Path) -> Path:
    """Make Hypothesis keep its storage under ``directory/hypothesis``; returns that path.

    Must run before Hypothesis first touches its storage, which it does
    lazily, on the first test case that draws text.
    """
    from hypothesis.configuration import set_hypothesis_home_dir

    home = directory / "hypothesis"
    set_hypothesis_home_dir(home)
    return home
