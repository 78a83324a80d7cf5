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
A file path must not name a FIFO or a device (``/dev/full``): the write
would hang or fail only after the run.

Every report is written to a temporary file beside its path and renamed
over it (:func:`write_report`): a symlink planted at a predictable report
name is replaced, never followed, and a reader never sees half a report.
Text that cannot be UTF-8 (a handler command's undecodable bytes, kept by
Python as lone surrogates) is written escaped rather than failing the write.
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
import tempfile
from pathlib import Path

from dsm_sim.input_files import file_kind
from reference_engine.errors import ConfigurationError, DsmError

__all__ = [
    "OutputKind",
    "OutputPathError",
    "ReportWriteError",
    "check_output",
    "write_file",
    "write_report",
]


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

    if kind is OutputKind.FILE and path.is_symlink():
        path = path.parent  # replaced by the write, never followed: its directory must take it
        if not _writable(path):
            raise refuse(f"is a symlink in {str(path)!r}, which is not writable")
        return
    if path.exists():
        if kind is OutputKind.FILE and path.is_dir():
            raise refuse("is a directory")
        mode = path.stat().st_mode
        if kind is OutputKind.FILE and not stat.S_ISREG(mode):
            raise refuse(f"is {file_kind(mode)}, not a regular file")
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


def write_file(path: Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``.

    The rename replaces a regular file or a symlink at ``path`` without following
    it, and the file is complete or absent, never half written.  A device or a
    FIFO at ``path`` is written into instead.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(mode := os.lstat(path).st_mode) and not stat.S_ISLNK(mode):
            # A device or FIFO the user named is written into, never replaced (renaming over
            # /dev/full as root would put a file in its place); non-blocking, so a FIFO
            # nobody reads fails now instead of hanging.
            flags = os.O_WRONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
            with os.fdopen(os.open(path, flags), "wb") as device:
                device.write(data)
            return path
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def write_report(path: Path, text: str) -> Path:
    """Write a text report as UTF-8 (see :func:`write_file`); undecodable bytes escaped."""
    return write_file(path, text.encode("utf-8", "backslashreplace"))
