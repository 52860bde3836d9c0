"""Payloads kept by reference: a value too large for the log lives in a JetStream object
bucket, and the log holds a reference to it, ``{"$object": {bucket, name, size, digest}}``.
Pure: what a reference is, how it is written and checked, and where references may stand
in a run's state. Storing and loading are the shell's (``interlock.transport.objects``).

A reference stands for a whole payload: an event's or an answer's ``data``, a run's
inputs, an action's input, an output, a context value. Its ``digest`` is the SHA-256 of
the stored bytes (the object store's own ``SHA-256=<base64url>`` form), so whoever loads
it knows whether the bytes are the ones the log names: the same reference always stands
for the same value, which is what keeps a decision over it deterministic.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

import msgspec

from interlock.core.vocabulary import InterlockError

MARKER = "$object"
"""The one key of a reference's JSON form."""
DIGEST_PREFIX = "SHA-256="
_NAME = re.compile(r"^[A-Za-z0-9_=.-]{1,300}$")
_BUCKET = re.compile(r"^[A-Za-z0-9_-]{1,120}$")


class ObjectError(InterlockError):
    """A reference that is malformed, names a bucket it may not, is over the bound, or
    whose object is missing or does not match its digest."""

    reason = "bad-object"
    """The dead-letter reason of a message that carries such a reference."""

    @property
    def detail(self) -> str:
        return str(self)


class StoredObjectDamaged(ObjectError):
    """A value a run's own log names by reference whose stored object is missing or does
    not match its reference (overwritten, deleted, or otherwise damaged in its bucket):
    nothing the reader sent is at fault, the stored data is."""


class ObjectUnavailable(InterlockError):
    """An object that could not be read now (the server did not answer in time): reading
    it again may succeed, unlike an :class:`ObjectError`."""


class ObjectRef(msgspec.Struct, frozen=True, kw_only=True):
    """Where a payload is kept and what it must hash to."""

    bucket: str
    name: str
    size: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        """The reference as it stands in a payload's place."""
        return {MARKER: {"bucket": self.bucket, "name": self.name, "size": self.size,
                         "digest": self.digest}}  # fmt: skip


def digest_of(data: bytes) -> str:
    """The object store's digest of ``data``: ``SHA-256=<base64url of the hash>``."""
    return DIGEST_PREFIX + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


def name_of(digest: str) -> str:
    """The name an object is stored under: from its digest, so that the same bytes are
    stored once per bucket and a name never stands for two contents."""
    raw = base64.urlsafe_b64decode(digest.removeprefix(DIGEST_PREFIX))
    return "sha256-" + raw.hex()


def is_marker(value: Any) -> bool:
    """Whether ``value`` has a reference's shape (one key, ``$object``)."""
    return type(value) is dict and len(value) == 1 and MARKER in value


def parse_ref(value: Any, where: str = "data") -> ObjectRef:
    """The reference ``value`` stands for; :class:`ObjectError` saying what is wrong."""
    if not is_marker(value):
        raise ObjectError(f"{where}: not an object reference")
    body = value[MARKER]
    if not isinstance(body, dict):
        raise ObjectError(f"{where}: {MARKER} must be an object")
    unknown = set(body) - {"bucket", "name", "size", "digest"}
    if unknown:
        raise ObjectError(f"{where}: {MARKER} has unknown fields {sorted(unknown)}")
    bucket, name, size, digest = (body.get(k) for k in ("bucket", "name", "size", "digest"))
    if not isinstance(bucket, str) or not _BUCKET.match(bucket):
        raise ObjectError(f"{where}: {MARKER}.bucket must be a bucket name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ObjectError(f"{where}: {MARKER}.name must be an object name")
    if type(size) is not int or size < 0:
        raise ObjectError(f"{where}: {MARKER}.size must be a whole number of bytes")
    canonical = canonical_digest(digest)
    if canonical is None:
        raise ObjectError(
            f"{where}: {MARKER}.digest must be SHA-256=<base64url of the 32 bytes of the "
            f"SHA-256>, got {str(digest)[:80]!r}"
        )
    return ObjectRef(bucket=bucket, name=name, size=size, digest=canonical)


def canonical_digest(digest: Any) -> str | None:
    """``digest`` in the one form references are compared in (``SHA-256=`` and the padded
    base64url the object stores write), or None when it is no SHA-256 digest. The padding
    may be left out (RFC 4648 allows it, and ``digest("base64url")`` in Node does), so an
    agent of another language may write either."""
    if not isinstance(digest, str) or not digest.startswith(DIGEST_PREFIX):
        return None
    text = digest.removeprefix(DIGEST_PREFIX)
    if len(text) not in (43, 44):
        return None
    try:
        raw = base64.b64decode(text.ljust(44, "="), altchars=b"-_", validate=True)
    except ValueError:
        return None
    return DIGEST_PREFIX + base64.urlsafe_b64encode(raw).decode() if len(raw) == 32 else None


def ref_of(value: Any) -> ObjectRef | None:
    """The reference ``value`` is, or None when it is a value of its own (a malformed
    reference raises :class:`ObjectError`)."""
    return parse_ref(value) if is_marker(value) else None
