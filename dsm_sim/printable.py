"""Text from a handler, made safe to print to a terminal and to write into XML.

A handler's error message, stderr or command line may carry control bytes:
an ESC sequence that clears the screen, moves the cursor or retitles the
terminal, a BEL, a NUL.  Printed raw, they would rewrite what the operator
sees; written into JUnit, they make the file malformed (XML 1.0 cannot carry
most of C0 at all).  Each such character is shown as its escape instead
(``\\x1b``), so nothing is lost and nothing is obeyed.
"""

from __future__ import annotations

import io
import re
from typing import TextIO, cast

__all__ = ["PrintableStream", "printable", "printable_stream", "xml_safe"]

#: C0 controls but tab and newline, DEL, C1 controls, and lone surrogates (undecodable bytes).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
#: What XML 1.0 cannot carry (its Char production), plus C1 controls and DEL.
_NOT_XML = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character but tab and newline shown as its escape."""
    return _UNPRINTABLE.sub(_escape, text)


def xml_safe(text: str) -> str:
    """``text`` with every character XML 1.0 cannot carry shown as its escape."""
    return _NOT_XML.sub(_escape, text)


class PrintableStream(io.TextIOBase):
    """A text stream that escapes control characters on their way to ``target``.

    For plain reports only, whose own text has no control characters but
    newlines: whatever a handler put into them is shown, never obeyed.
    """

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self.target = target

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.target.isatty()

    def write(self, text: str) -> int:
        return self.target.write(printable(text))

    def flush(self) -> None:
        self.target.flush()


def printable_stream(target: TextIO) -> TextIO:
    """``target`` behind a :class:`PrintableStream`, typed as the stream it stands in for."""
    return cast(TextIO, PrintableStream(target))
