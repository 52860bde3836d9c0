"""The workflows applied now, as a client reads them to work out what an event it emits
starts: each workflow's newest version, spec hash and manifest (nothing compiled).

Read whole once, then kept current by reading only the workflows bucket's records stored
since the last look (:func:`~interlock.transport.kvread.scan_bucket` after the revision
seen: one request when nothing changed, the new pointers and bodies when something did),
so an emit costs about what a publish costs, where each read the whole bucket, every
version of every workflow. No consumer is made (a watch per client would stay on the
server after the client left; see :func:`~interlock.transport.kvread._fold`). The records
are read as a replica has them, as any read of the bucket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nats.js.errors import BucketNotFoundError, NotFoundError

from interlock.runtime.foreign import bucket_object, version_of
from interlock.transport.kvread import scan_bucket

if TYPE_CHECKING:
    from interlock.runtime.registry import Registry

Catalog = dict[tuple[str, str], tuple[int, str, dict[str, Any]]]
"""(namespace, name) -> (newest version, spec hash, manifest) of every workflow applied."""


class AppliedWorkflows:
    """:data:`Catalog` of the workflows applied, current as of each :meth:`current`."""

    def __init__(self, registry: Registry, bucket: str) -> None:
        self._registry = registry
        self._bucket = bucket
        self._catalog: Catalog = {}
        self._seen = 0
        """The bucket's revision up to which its records have been taken into account."""
        self._lock = asyncio.Lock()  # concurrent emits share one look
        self.records_read = 0
        """Records of the bucket read so far (what a look cost)."""

    async def current(self) -> Catalog:
        """The workflows applied now: the records stored since the last call read, and
        nothing more. Empty when there is no workflows bucket yet."""
        async with self._lock:
            try:
                kv = await self._registry.workflows_kv()
                pointers: dict[str, bytes] = {}
                bodies: dict[str, bytes] = {}
                async for revision, key, value in scan_bucket(kv, ">", self._seen):
                    self.records_read += 1
                    self._seen = max(self._seen, revision)
                    if key.startswith("latest."):
                        pointers[key] = value
                    elif key.startswith("wf."):
                        bodies[key] = value
            except (BucketNotFoundError, NotFoundError):
                return {}
            for key, value in pointers.items():
                await self._take(key, value, bodies)
            return dict(self._catalog)

    async def _take(self, key: str, value: bytes, bodies: dict[str, bytes]) -> None:
        """The workflow of pointer ``key`` as its new ``value`` says (gone when deleted or
        not a pointer Interlock wrote, which is reported): its body from those read with
        it, else read by its key (written before the records read last time)."""
        _, ns, name = key.split(".", 2)
        pointer = bucket_object(self._bucket, key, value) if value else None
        version = version_of(pointer)
        if pointer is None or version is None:
            self._catalog.pop((ns, name), None)
            return
        body_key = f"wf.{ns}.{name}.{version}"
        manifest: Any = None
        if body_key in bodies:
            body = bucket_object(self._bucket, body_key, bodies[body_key])
            manifest = body.get("manifest") if body is not None else None
        else:
            try:
                manifest = (await self._registry.stored(ns, name, version)).manifest
            except Exception:  # noqa: BLE001 - not readable: the orchestrator skips it too
                manifest = None
        self._catalog[(ns, name)] = (
            version,
            str(pointer.get("spec_hash", "")),
            dict(manifest) if isinstance(manifest, Mapping) else {},
        )
