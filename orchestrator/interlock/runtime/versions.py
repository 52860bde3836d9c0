"""Workflow versions: what one stored version is (:class:`StoredWorkflow`), what applying
something did (:class:`Applied`), and storing a version under the first free number,
never over another's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nats.js.errors import KeyWrongLastSequenceError

from interlock.runtime.foreign import entry_object

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from interlock.core.definition import Definition
    from interlock.views.outline import WorkflowOutline


@dataclass(frozen=True, slots=True)
class StoredWorkflow:
    """One stored version of a workflow: its manifest as applied and its outline."""

    namespace: str
    name: str
    version: int
    spec_hash: str
    manifest: Mapping[str, Any]
    outline: WorkflowOutline
    source: str = ""
    """The manifest as it was written (comments and all), when it was applied as text."""


@dataclass(frozen=True, slots=True)
class Applied:
    kind: str
    namespace: str
    name: str
    version: int
    changed: bool


async def store_version(
    workflows: KeyValue, bucket: str, definition: Definition, first: int
) -> int:
    """Store the manifest under the first free version number from ``first`` on.

    A version, once written, never changes (runs on it fold with it): a number taken by
    a concurrent apply of other content is skipped, never overwritten. The same content
    found there (an apply that stopped before moving the pointer) is taken over.
    """
    from interlock.views.outline import encode_outline, outline_of

    ns, name = definition.namespace, definition.name
    outline = encode_outline(outline_of(definition))
    version = first
    while True:
        body = json.dumps(
            {
                "version": version,
                "spec_hash": definition.spec_hash,
                "manifest": dict(definition.manifest),
                "outline": outline,
                **({"source": definition.source} if definition.source else {}),
            }
        ).encode()
        key = f"wf.{ns}.{name}.{version}"
        try:
            await workflows.create(key, body)
        except KeyWrongLastSequenceError:
            entry = await workflows.get(key)
            taken = entry_object(bucket, entry)
            if taken is not None and taken.get("spec_hash") == definition.spec_hash:
                return version
            version += 1
        else:
            return version
