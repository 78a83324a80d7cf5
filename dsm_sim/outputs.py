"""Report, JUnit and JSON paths: checked before a run, and a failed write named after it.

A run can take minutes; finding out only at its end that ``--junit`` points
into a directory that does not exist (or at a directory, or under a file)
would throw the run away with a traceback and leave CI without its verdict.
So every output path is checked when the command starts, as a usage error,
and a write that still fails at the end (the disk filled up, the directory
was removed meanwhile) is reported as :class:`ReportWriteError` after the
verdict has been printed, never instead of it.

Missing directories are created, as they always were; what must hold is
that the nearest existing ancestor is a directory the user may write in.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

from reference_engine.errors import ConfigurationError, DsmError

__all__ = ["OutputKind", "OutputPathError", "ReportWriteError", "check_output"]


class OutputKind(enum.Enum):
    """Whether an option names one file (``--junit``, ``--json``) or a directory (``--report``)."""

    FILE = "file"
    DIRECTORY = "directory"


class OutputPathError(ConfigurationError):
    """An output option names a path the command could not write its report to."""

    def __init__(self, *, option: str, path: str, problem: str, kind: str) -> None:
        self.option = option
        self.path = path
        self.problem = problem
        self.kind = kind
        super().__init__(
            f"{option} {path!r}: {problem}; give a {kind} path whose directory exists (or "
            "can be created) and is writable"
        )


class ReportWriteError(DsmError):
    """Writing a report failed after the run; the verdict printed before it stands."""

    def __init__(self, *, option: str, path: str, reason: str) -> None:
        self.option = option
        self.path = path
        self.reason = reason
        super().__init__(
            f"could not write the {option} output to {path!r}: {reason}; the verdict above "
            "stands, but this output is missing or incomplete"
        )


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK) if path.is_dir() else os.access(path, os.W_OK)


def check_output(option: str, path: Path, kind: OutputKind) -> None:
    """Raise :class:`OutputPathError` unless ``path`` can be written (or created) as ``kind``."""

    def refuse(problem: str) -> OutputPathError:
        return OutputPathError(option=option, path=str(path), problem=problem, kind=kind.value)

    if path.exists():
        if kind is OutputKind.FILE and path.is_dir():
            raise refuse("is a directory")
        if kind is OutputKind.DIRECTORY and not path.is_dir():
            raise refuse("is a file, not a directory")
        if not _writable(path):
            raise refuse("is not writable")
        return
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise refuse(f"cannot be created: {str(ancestor)!r} is a file, not a directory")
    if not _writable(ancestor):
        raise refuse(f"cannot be created: the directory {str(ancestor)!r} is not writable")
