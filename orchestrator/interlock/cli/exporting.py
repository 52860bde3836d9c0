"""An exported run log keeps each large payload once: ``interlock export`` writes every
payload of :data:`SHARED_MIN` bytes or more (an event's data, an action's input or result,
a context value, an output...) as an object line, named by the digest of its JSON, and the
records where it stood name it (``{"$exported": DIGEST}``); a payload a run carried through
seven records is written once, not seven times. Reading an export puts each value back in
its places, so replay, explain, fork and shadow of a file need no server; an export written
before objects (every payload in its records) reads as it always did.

A file::

    {"object": "SHA-256=...", "value": {...}}       # each object once, before the records
    {"specversion": "1.0", "type": "io.interlock.run.started", ...}
    ...
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec

from interlock.core import events as ev
from interlock.core.objects import digest_of
from interlock.runtime.payloads import on_slots
from interlock.transport.subjects import Subjects

SHARED_MIN = 4096
"""The JSON size from which a payload is written once as an object (smaller ones stay in
their records, where a reader of the file sees them)."""
MARKER = "$exported"
"""The one key of the value standing in a record for an object of the file."""
_OBJECT_LINE = b'{"object":'
_T = TypeVar("_T")


def _at_once(walk: Coroutine[Any, Any, _T]) -> _T:
    """The result of a walk over records whose slot function never waits (on_slots is
    async for the shell's loads): run to its end here, in or out of an event loop."""
    try:
        walk.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    walk.close()
    raise RuntimeError("a walk over an export's records waited")


def export_lines(records: list[ev.AnyRecord]) -> tuple[bytes, int]:
    """The JSONL of ``records`` (payloads loaded) with each large payload written once as
    an object: (the bytes, how many objects)."""
    objects: dict[str, bytes] = {}

    async def slot(value: Any, bucket: str, where: str) -> Any:
        encoded = msgspec.json.encode(value)
        if len(encoded) < SHARED_MIN:
            return value
        digest = digest_of(encoded)
        objects.setdefault(digest, encoded)
        return {MARKER: digest}

    async def walk() -> list[ev.AnyRecord]:
        return [await on_slots(Subjects(), r, slot) for r in records]

    shared = _at_once(walk())
    head = b"".join(
        b'{"object":' + msgspec.json.encode(d) + b',"value":' + v + b"}\n"
        for d, v in objects.items()
    )
    return head + b"".join(ev.encode(r) + b"\n" for r in shared), len(objects)


def read_export(data: bytes) -> list[ev.AnyRecord]:
    """The records of an export, each object put back in its places (ValueError: a line
    that is not a record or an object, or a record naming an object the file lacks)."""
    objects: dict[str, Any] = {}
    lines = []
    for n, line in enumerate(data.splitlines(), 1):
        if line.startswith(_OBJECT_LINE):
            found = msgspec.json.decode(line)
            if not isinstance(found.get("object"), str) or "value" not in found:
                raise ValueError(f"line {n}: an object line needs 'object' and 'value'")
            objects[found["object"]] = found["value"]
        elif line.strip():
            lines.append(line)
    records = ev.decode_lines(b"\n".join(lines))
    if not objects:
        return records

    async def put_back() -> list[ev.AnyRecord]:
        out = []
        for record in records:

            async def slot(value: Any, bucket: str, where: str, r: Any = record) -> Any:
                if type(value) is dict and len(value) == 1 and MARKER in value:
                    digest = value[MARKER]
                    if digest not in objects:
                        raise ValueError(
                            f"record {r.id}: its {where} is object {digest}, which the file "
                            "does not hold"
                        )
                    return objects[digest]
                return value

            out.append(await on_slots(Subjects(), record, slot))
        return out

    return _at_once(put_back())
