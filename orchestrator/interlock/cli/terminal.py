"""What the CLI writes to a terminal is shown, never obeyed.

Much of what it prints comes from other parties: an agent's dead-letter reason and detail,
a worker's name, an error an agent reported, an event's source. A control character in
it (the start of an ANSI escape sequence) could move the cursor over earlier lines, clear
the screen, retitle the window or write the clipboard. On a terminal, every control
character but tab and newline is written as ``\\xNN``; what goes to a pipe or a file
(JSON for ``jq``, say) is left byte for byte as it was.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 but tab and newline, DEL, and C1 (whose 0x9b is a one-character CSI)."""


def shown(text: str) -> str:
    """``text`` with its control characters (but tab and newline) as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


_JSON_CONTROL = re.compile("[\x7f-\x9f]")
"""DEL and C1: what a JSON encoder leaves raw (it escapes C0 itself)."""


def shown_json(text: str) -> str:
    """JSON ``text`` with DEL and the C1 control characters as ``\\u00NN`` escapes: the
    same JSON (it decodes to the same values), nothing a terminal obeys."""
    return _JSON_CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def write_json_lines(data: bytes) -> None:
    """Write JSON lines to standard output: byte for byte to a pipe or a file, through
    :func:`shown_json` to a terminal."""
    stdout = sys.stdout
    if isinstance(stdout, ShownStream):
        stdout.raw.write(shown_json(data.decode("utf-8", "replace")))
        stdout.raw.flush()
    else:
        stdout.flush()
        stdout.buffer.write(data)


class ShownStream:
    """A text stream writing :func:`shown` text to the terminal under it."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @property
    def raw(self) -> TextIO:
        """The terminal's own stream, for text that escapes itself (:func:`shown_json`)."""
        return self._stream

    def write(self, text: str) -> int:
        self._stream.write(shown(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_terminals() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` show what they are given, where each is a
    terminal."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, ShownStream):
            continue
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):  # no such method, or closed
            continue
        if tty:
            setattr(sys, name, ShownStream(stream))
