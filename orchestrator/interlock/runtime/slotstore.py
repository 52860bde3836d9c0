"""The slots bucket's entries as stored: decoded (a value that is not an entry reported
and written over), and as this process last wrote them (:class:`Written`)."""

from __future__ import annotations

import msgspec

from interlock.runtime.foreign import foreign_value
from interlock.runtime.slotlines import SlotEntry

_decode_entry = msgspec.json.Decoder(SlotEntry).decode


def decode_entry(
    bucket: str, token: str, value: bytes | None, revision: int = 0
) -> SlotEntry | None:
    """A stored entry; None (reported) for a value that is not one, which the next change
    writes over with what the relay knows from then on."""
    if not value:
        return None
    try:
        return _decode_entry(value)
    except msgspec.DecodeError:
        foreign_value(bucket, token, "not a slots entry", revision)
        return None


class Written:
    """Entries as this process last wrote them, with the bytes written: the next change of
    one starts from the object while those bytes are still what the process knows of it
    (decoding an entry of 200 holders costs some 0.1 ms, at every change)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[bytes, SlotEntry]] = {}

    def peek(self, token: str) -> SlotEntry | None:
        """The entry ``token`` as last written here (not to be changed), if kept."""
        held = self._entries.get(token)
        return None if held is None else held[1]

    def take(self, token: str, value: bytes) -> tuple[SlotEntry | None, bytes | None]:
        """The entry ``token`` as written here, if ``value`` is what was written (and those
        bytes); else (None, None). Taken: a change may alter it, and keeps it once written."""
        held = self._entries.pop(token, None)
        return (held[1], value) if held is not None and held[0] is value else (None, None)

    def keep(
        self, token: str, writes: list[tuple[str, bytes | None, int]], entry: SlotEntry
    ) -> None:
        """``entry`` as written by ``writes`` (nothing when they did not write it)."""
        value = next((v for k, v, _ in writes if k == token), None)
        if value is not None and len(self._entries) < 4096:
            self._entries[token] = (value, entry)
