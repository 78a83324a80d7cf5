"""What a ``dsm run`` left on disk, for the tests that compare a serial run with a parallel one."""

from __future__ import annotations

from pathlib import Path

__all__ = ["files_under"]


def files_under(root: Path) -> dict[str, bytes]:
    """Every file below ``root``, by its relative path: reports compare byte for byte."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
