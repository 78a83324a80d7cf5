"""Input files read without surprises: regular files only, and never more than a cap.

A path a user gives (a scenario, a replay file) may name a FIFO that never
ends, ``/dev/zero`` that never stops, or a file of gigabytes.  Reading it
whole would hang the command or exhaust memory before anything could be
said about it.  So the type is checked before the open and again on the
open descriptor (opened non-blocking, so a FIFO swapped in meanwhile cannot
block), and the read stops one byte past the cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["InputFileProblem", "file_kind", "read_bounded"]


class InputFileProblem(Exception):
    """What is wrong with an input file, in words for the caller's own named error."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, as an error message names it."""
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, or the problem."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise InputFileProblem(f"is {file_kind(mode)}")
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
        with os.fdopen(fd, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise InputFileProblem(f"is {file_kind(mode)}")
            data = file.read(limit + 1)
    except OSError as exc:
        raise InputFileProblem(f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise InputFileProblem(f"is larger than {limit} bytes")
    return data
