"""How the thorough tier splits a list of cases: one rule for every test folder.

``tests/`` is on the import path (pytest puts the folder of the root
``conftest.py`` there), so any test module imports it as ``tiers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["every_other_nightly"]


def every_other_nightly(paths: Sequence[Path]) -> list[Any]:
    """One case per path, named by its stem: the even ones on every pull request, the rest nightly.

    The odd ones are marked ``thorough`` (``pytest --thorough``, ``nox -s thorough``).
    """
    return [
        pytest.param(path, marks=[pytest.mark.thorough] if index % 2 else [], id=path.stem)
        for index, path in enumerate(paths)
    ]
