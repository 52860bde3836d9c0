"""Payloads by reference in JetStream object buckets: storing a payload, loading it back
checked against its digest and a bound, and deleting it.

Writing follows the object store's layout (ADR-20: 128 KiB chunks on ``$O.<bucket>.C.<nuid>``,
then the meta message on ``$O.<bucket>.M.<name>``, each with a publish acknowledgement), but
the meta goes without ``Nats-Rollup: sub``: the orchestrator's buckets take no rollups (a
message stored with ``Nats-Rollup: all`` purges every object of its bucket, and a user of
the orchestrator's account can have a direct get copy one there). A name is its bytes'
digest, so a meta is written once per name; one written over a damaged one is the newest,
which is what readers take. Reading is by batched direct gets of
the same layout (the meta message of ``$O.<bucket>.M.<name>``, then the chunks of
``$O.<bucket>.C.<nuid>``), for two reasons: it makes no consumer (nats-py's ``get`` makes
an ordered push consumer per read, which the gateway's and the parties' permissions do not
allow, and whose pushed messages cannot leave the orchestrator's account toward an
agent's), and it stops at the bound before it has read more than the meta promised.
Every read is checked against the SHA-256 the reference names, so an object replaced
under the same name is refused, never taken for the one the log meant.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BadRequestError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore
from nats.nuid import NUID

from interlock.core.objects import (
    ObjectError,
    ObjectRef,
    ObjectUnavailable,
    canonical_digest,
    digest_of,
    name_of,
)
from interlock.transport.directget import LogReadError, read_subject
from interlock.transport.jetstream import jetstream
from interlock.transport.natsclient import js_api

DEFAULT_THRESHOLD = 256 * 1024
"""Bytes from which a payload is stored by reference (its encoded JSON)."""
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""The largest payload stored or loaded by reference."""
MIN_CHUNK_BYTES = 1024
"""The smallest chunks an object's size may be cut into, on average: an object of ``size``
bytes has at most ``ceil(size / MIN_CHUNK_BYTES)`` chunks (NATS clients cut 128 KiB ones).
A party writes its own bucket's chunks and meta, and the meta says how many chunks to
read: without a bound, a few bytes' reference to a meta of a million empty chunks made
every event naming it cost a read of all of them."""
CHUNK_BYTES = 128 * 1024
"""The chunks an object is cut into (as NATS object store clients cut them)."""
_TIMEOUT = 10.0
_NUID = NUID()
_OVERHEAD = 4096
"""Bytes an object's messages take in a stream beyond its bytes (its meta; its chunks'
subjects and headers are some 1/1024 more)."""


class BucketFull(ObjectError):
    """An object bucket holds as many bytes as it may (its ``max_bytes``)."""


@dataclass(frozen=True, slots=True)
class ObjectLimits:
    """From which size a payload goes by reference, and the largest one taken."""

    threshold: int = DEFAULT_THRESHOLD
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_env(cls) -> ObjectLimits:
        """``INTERLOCK_OBJECT_THRESHOLD`` and ``INTERLOCK_OBJECT_MAX_BYTES``, else defaults."""
        return cls(
            threshold=_env_bytes("INTERLOCK_OBJECT_THRESHOLD", DEFAULT_THRESHOLD),
            max_bytes=_env_bytes("INTERLOCK_OBJECT_MAX_BYTES", DEFAULT_MAX_BYTES),
        )

    def __post_init__(self) -> None:
        if self.threshold < 1024 or self.max_bytes < self.threshold:
            raise ValueError(
                f"object limits: the threshold ({self.threshold}) must be at least 1024 "
                f"bytes and the bound ({self.max_bytes}) at least the threshold"
            )


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_bytes(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from exc


def parse_bytes(text: str) -> int:
    """``262144``, ``256KiB``, ``64MiB``, ``1GiB`` (also KB, MB, GB as powers of 1000)."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6,
             "gb": 10**9, "b": 1}  # fmt: skip
    lowered = text.strip().lower()
    for unit, factor in units.items():
        if lowered.endswith(unit) and lowered[: -len(unit)].strip().isdigit():
            return int(lowered[: -len(unit)]) * factor
    if lowered.isdigit():
        return int(lowered)
    raise ValueError(f"{text!r} is not a size (262144, 256KiB, 64MiB)")


def stream_of(bucket: str) -> str:
    return f"OBJ_{bucket}"


def bucket_config(
    bucket: str,
    *,
    replicas: int = 1,
    max_age_s: float | None = None,
    max_bytes: int | None = None,
    rollups: bool = False,
) -> api.StreamConfig:
    """The stream of an object bucket, laid out as NATS object store clients expect
    (ADR-20), with or without rollups (see :meth:`Objects.ensure_bucket`)."""
    return api.StreamConfig(
        name=stream_of(bucket),
        description="Interlock payloads kept by reference",
        subjects=[f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        discard=api.DiscardPolicy.NEW,
        num_replicas=replicas,
        max_age=max_age_s or 0,
        max_bytes=max_bytes or -1,
        allow_rollup_hdrs=rollups,
        allow_direct=True,
    )


_OFF_LOOP = 1 << 20
"""Bytes from which an object is hashed and decoded on a thread of its own: a 60 MiB one
held the event loop (every run's decisions) for some 0.6 s."""


async def _digest(data: bytes) -> str:
    return digest_of(data) if len(data) < _OFF_LOOP else await asyncio.to_thread(digest_of, data)


def _chunks(bucket: str, nuid: str) -> str:
    return f"$O.{bucket}.C.{nuid}"


def _full(exc: APIError) -> bool:
    """Whether JetStream refused a write because the stream holds its ``max_bytes``."""
    return "maximum bytes" in (exc.description or "").lower()


async def store_object(js: JetStreamContext, bucket: str, name: str, data: bytes) -> None:
    """Write ``data`` as the object ``name`` of ``bucket``: its chunks on a new nuid, then
    its meta, without ``Nats-Rollup`` (the newest meta of a name is the object). Chunks
    sent before a refusal stay until their age (a party's credential may not purge)."""
    nuid = _NUID.next().decode()
    chunks = _chunks(bucket, nuid)
    count = 0
    for start in range(0, len(data), CHUNK_BYTES):
        await js.publish(chunks, data[start : start + CHUNK_BYTES])
        count += 1
    info = api.ObjectInfo(
        name=name,
        bucket=bucket,
        nuid=nuid,
        size=len(data),
        chunks=count,
        digest=digest_of(data),
        mtime=datetime.now(UTC).isoformat(),
        options=api.ObjectMetaOptions(max_chunk_size=CHUNK_BYTES),
    )
    await js.publish(_meta_subject(bucket, name), json.dumps(info.as_dict()).encode())


def _meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


class Objects:
    """Object buckets seen through one connection (its account's JetStream API prefix)."""

    def __init__(self, nc: Client, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.nc = nc
        self.js = jetstream(nc)
        self.max_bytes = max_bytes

    async def ensure_bucket(
        self,
        bucket: str,
        *,
        replicas: int = 1,
        max_age_s: float | None = None,
        max_bytes: int | None = None,
        rollups: bool = False,
    ) -> None:
        """Make the bucket if it is missing (the orchestrator's and operators' accounts),
        its objects kept ``max_age_s`` seconds (None: until deleted), at most ``max_bytes``
        bytes in all (None: no bound; a put past it is refused, :class:`BucketFull`).

        ``rollups``: whether the bucket takes ``Nats-Rollup`` (a party's own bucket does:
        NATS object store clients put a meta with ``Nats-Rollup: sub``; one with ``all``
        there purges that party's objects only). A bucket that exists is brought to these
        settings where it differs in them (a task-input bucket made when every object
        bucket took rollups, a party's whose bound changed)."""
        config = bucket_config(
            bucket, replicas=replicas, max_age_s=max_age_s, max_bytes=max_bytes, rollups=rollups
        )
        try:
            info = await self.js.stream_info(stream_of(bucket))
        except NotFoundError:
            try:
                info = await self.js.add_stream(config)
            except BadRequestError:  # made meanwhile by another process
                info = await self.js.stream_info(stream_of(bucket))
        have = info.config
        if (
            bool(have.allow_rollup_hdrs) != rollups
            or (have.max_bytes or -1) != (max_bytes or -1)
            or (max_age_s is not None and (have.max_age or 0) != max_age_s)
        ):
            have.allow_rollup_hdrs = rollups
            have.max_bytes = max_bytes or -1
            if max_age_s is not None:
                have.max_age = max_age_s
            await self.js.update_stream(have)

    async def put(self, bucket: str, data: bytes, *, prefix: str = "") -> ObjectRef:
        """Store ``data`` under a name derived from its digest, after ``prefix`` (once:
        stored already with that digest, it is not sent again) and return its reference."""
        if len(data) > self.max_bytes:
            raise ObjectError(
                f"a payload of {len(data)} bytes is over the bound of {self.max_bytes} bytes"
            )
        digest = digest_of(data)
        name = prefix + name_of(digest)
        store = ObjectStore(name=bucket, stream=stream_of(bucket), js=self.js)
        ref = ObjectRef(bucket=bucket, name=name, size=len(data), digest=digest)
        try:
            info = await store.get_info(name)
        except ObjectNotFoundError:
            info = None
        if info is not None and info.digest == digest and info.size == len(data):
            return ref
        # A bounded bucket (a party's) that cannot take it all is told before any chunk
        # is sent: chunks stored before a refusal would hold its room until their age.
        held = await self.js.stream_info(stream_of(bucket))
        room = (held.config.max_bytes or -1) - (held.state.bytes or 0)
        if (held.config.max_bytes or -1) > 0 and room < len(data) + len(data) // 1024 + _OVERHEAD:
            raise await self._full(bucket, len(data))
        try:
            await store_object(self.js, bucket, name, data)
        except APIError as exc:
            if _full(exc):  # filled meanwhile by another put
                raise await self._full(bucket, len(data)) from exc
            raise
        if info is not None and info.nuid and not info.deleted:
            # The damaged object's chunks (a party may not purge: they go with its age).
            with contextlib.suppress(APIError):
                await self.js.purge_stream(stream_of(bucket), subject=_chunks(bucket, info.nuid))
        return ref

    async def _full(self, bucket: str, size: int) -> BucketFull:
        """What to tell the writer of ``size`` bytes refused by the full ``bucket``."""
        held = bound = "?"
        # The refusal is the news; the numbers are extra.
        with contextlib.suppress(Exception):
            info = await self.js.stream_info(stream_of(bucket))
            held, bound = str(info.state.bytes), str(info.config.max_bytes)
        return BucketFull(
            f"object bucket {bucket} is full: it holds {held} bytes of the {bound} it may, "
            f"and {size} more were refused; its objects expire with their age (or are "
            "deleted with their run), or its operator raises the bound (`interlock creds "
            "issue --upload-limit`, for a party's bucket)"
        )

    async def put_value(self, bucket: str, value: Any) -> dict[str, Any]:
        """Store ``value`` as JSON and return the reference that stands in its place."""
        return (await self.put(bucket, msgspec.json.encode(value))).to_json()

    async def get(self, ref: ObjectRef) -> bytes:
        """The bytes ``ref`` names, checked: its size within the bound, the meta and the
        bytes read matching its size and digest. :class:`ObjectError` says what failed."""
        where = f"object {ref.bucket}/{ref.name}"
        if ref.size > self.max_bytes:
            raise ObjectError(f"{where}: {ref.size} bytes, over the bound of {self.max_bytes}")
        stream = stream_of(ref.bucket)
        meta = await self._meta(stream, ref, where)
        if meta.get("deleted"):
            raise ObjectError(f"{where}: deleted")
        if canonical_digest(meta.get("digest")) != ref.digest or meta.get("size") != ref.size:
            raise ObjectError(
                f"{where}: digest mismatch: the reference names {ref.digest} ({ref.size} "
                f"bytes), the bucket holds {meta.get('digest')} ({meta.get('size')} bytes)"
            )
        if ref.size == 0:
            data = b""
        else:
            nuid, chunks = meta.get("nuid"), meta.get("chunks")
            if not isinstance(nuid, str) or type(chunks) is not int or chunks <= 0:
                raise ObjectError(f"{where}: malformed meta")
            if chunks > -(-ref.size // MIN_CHUNK_BYTES):
                raise ObjectError(
                    f"{where}: {chunks} chunks for {ref.size} bytes (chunks of "
                    f"{MIN_CHUNK_BYTES} bytes at least, on average)"
                )
            try:
                got = await read_subject(self.nc, stream, f"$O.{ref.bucket}.C.{nuid}", limit=chunks)
            except (LogReadError, nats.errors.Error) as exc:
                raise ObjectUnavailable(f"{where}: {exc}") from exc
            data = b"".join(part for _, part in got)
        if len(data) != ref.size or await _digest(data) != ref.digest:
            raise ObjectError(
                f"{where}: digest mismatch: the bytes stored ({len(data)}) do not hash to "
                f"{ref.digest}; the object was changed after it was referenced"
            )
        return data

    async def get_value(self, ref: ObjectRef) -> Any:
        """The JSON value ``ref`` names (see :meth:`get`)."""
        data = await self.get(ref)
        try:
            if len(data) < _OFF_LOOP:
                return msgspec.json.decode(data)
            return await asyncio.to_thread(msgspec.json.decode, data)
        except msgspec.DecodeError as exc:
            raise ObjectError(f"object {ref.bucket}/{ref.name}: not JSON: {exc}") from exc

    async def _meta(self, stream: str, ref: ObjectRef, where: str) -> dict[str, Any]:
        body = json.dumps({"last_by_subj": _meta_subject(ref.bucket, ref.name)}).encode()
        try:
            msg = await self.nc.request(
                f"{js_api(self.nc)}.DIRECT.GET.{stream}", body, timeout=_TIMEOUT
            )
        except Exception as exc:
            raise ObjectUnavailable(
                f"{where}: cannot be read ({type(exc).__name__}: {exc})"
            ) from exc
        status = (msg.headers or {}).get("Status")
        if status == "404":
            raise ObjectError(f"{where}: not found")
        if status:
            raise ObjectUnavailable(f"{where}: cannot be read (status {status})")
        try:
            meta = json.loads(msg.data)
        except ValueError as exc:
            raise ObjectError(f"{where}: malformed meta") from exc
        if not isinstance(meta, dict):
            raise ObjectError(f"{where}: malformed meta")
        return meta

    async def delete(self, ref: ObjectRef) -> None:
        """Remove the object (its chunks and its meta), whatever it holds now; gone
        already is not an error."""
        store = ObjectStore(name=ref.bucket, stream=stream_of(ref.bucket), js=self.js)
        try:
            info = await store.get_info(ref.name, show_deleted=True)
        except (ObjectNotFoundError, NotFoundError):
            return
        stream = stream_of(ref.bucket)
        if info.nuid:
            await self.js.purge_stream(stream, subject=f"$O.{ref.bucket}.C.{info.nuid}")
        await self.js.purge_stream(stream, subject=_meta_subject(ref.bucket, ref.name))
