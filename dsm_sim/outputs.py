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
would hang or fail only after the run.  Nor may two options of one command
write one file (:func:`check_distinct`): both would be said written, and the
one written last would be the only one there.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dsm_sim.input_files import file_kind
from reference_engine.errors import ConfigurationError, DsmError

__all__ = [
    "Output",
    "OutputClashError",
    "OutputKind",
    "OutputPathError",
    "ReportWriteError",
    "check_distinct",
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


class OutputClashError(ConfigurationError):
    """Two output options of one command would write the same file (or one under the other).

    Each write would succeed and be said written, yet only the last one would
    be there: refused before the run, naming both options.
    """

    def __init__(
        self, *, option: str, path: str, other_option: str, other_path: str, problem: str
    ) -> None:
        self.option = option
        self.path = path
        self.other_option = other_option
        self.other_path = other_path
        self.problem = problem
        super().__init__(
            f"{option} {path!r} and {other_option} {other_path!r} {problem}, so one output "
            "would overwrite the other; give each output a path of its own"
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


@dataclass(frozen=True)
class Output:
    """One output option of a command, and for a directory the names of the files it writes.

    ``names`` are the files written directly in the directory (``index.html``,
    a page per run or counterexample); a file option may sit beside them.
    """

    option: str
    path: Path
    kind: OutputKind
    names: frozenset[str] = frozenset()


def _where(output: Output) -> Path:
    """Where ``output`` writes, spelt one way: a file's directory resolved, its name kept.

    A file's own name is not followed: the write replaces a symlink there
    instead of writing through it (:func:`write_file`).
    """
    if output.kind is OutputKind.DIRECTORY:
        return output.path.resolve()
    return output.path.parent.resolve() / output.path.name


def _clash(file: Output, other: Output) -> str | None:
    """How ``file`` and ``other`` collide, as the words after both names; None if they do not."""
    path, there = _where(file), _where(other)
    if other.kind is OutputKind.FILE:
        return "name the same file" if path == there else None
    if path == there:
        return f"name the same path, which cannot be both a file and the {other.option} directory"
    if path in there.parents:
        return f"collide: the file would have to be a directory, to hold {other.option}"
    if path.parent == there and path.name in other.names:
        return f"collide: {other.option} writes {path.name!r} there itself"
    return None


def check_distinct(outputs: Sequence[Output]) -> None:
    """Raise :class:`OutputClashError` if two of ``outputs`` would write one file.

    Paths are compared as the writes resolve them, so ``R/./index.html``,
    ``R/../R/index.html`` and a symlink to ``R`` are all ``R/index.html``.
    The error names the two options in the order given.
    """
    for index, first in enumerate(outputs):
        for second in outputs[index + 1 :]:
            if first.kind is OutputKind.FILE:
                problem = _clash(first, second)
            elif second.kind is OutputKind.FILE:
                problem = _clash(second, first)
            else:
                problem = None  # a command has one directory option
            if problem is not None:
                raise OutputClashError(
                    option=first.option,
                    path=str(first.path),
                    other_option=second.option,
                    other_path=str(second.path),
                    problem=problem,
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
