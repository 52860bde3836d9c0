"""Debugging by replay (docs/debugging.md): each function returns the report documented
there. They compile definitions, so the compiler is loaded here and nowhere else in the
client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.core.ids import check_run_id
from interlock.core.state import fold
from interlock.runtime.errors import RunExists

if TYPE_CHECKING:
    from interlock.core import events as ev
    from interlock.core.definition import Definition
    from interlock.runtime.client import InterlockClient
    from interlock.runtime.replaying import Replaying

Manifest = str | Path | tuple[str, str]
"""A manifest file, or a ``(name, text)`` pair."""


def _replaying(ops: InterlockClient) -> Replaying:
    from interlock.runtime.replaying import Replaying

    return Replaying(ops.log, ops.registry, ops.runs.clock)


def label_of(manifest: Manifest) -> str:
    return manifest[0] if isinstance(manifest, tuple) else str(manifest)


async def candidate(manifest: Manifest) -> Definition:
    """The definition a manifest file (or ``(name, text)`` pair) compiles to."""
    from interlock.runtime.replaying import compile_manifest

    name, text = (
        manifest
        if isinstance(manifest, tuple)
        else (str(manifest), await asyncio.to_thread(read_text, manifest))
    )
    return compile_manifest(name, text)


async def explain(
    ops: InterlockClient, records: list[ev.AnyRecord], at: int | None
) -> dict[str, Any]:
    return await _replaying(ops).explain(records, at=at)


async def replay(
    ops: InterlockClient, records: list[ev.AnyRecord], against: int | Manifest
) -> dict[str, Any]:
    from interlock.core import analysis

    replaying = _replaying(ops)
    if isinstance(against, int) or (isinstance(against, str) and "@" in against):
        definition, version, label = await replaying.named(records, against)
    else:
        await replaying.load_capabilities()
        definition = ops.registry.link(await candidate(against))
        version, label = 0, label_of(against)
    # Re-deciding a long log is seconds of CPU: off the event loop (see Replaying.explain).
    return await asyncio.to_thread(
        analysis.replay, records, definition, version=version, label=label
    )


async def shadow(
    ops: InterlockClient, workflow: str, manifest: Manifest, runs: int | None, since: str | None
) -> dict[str, Any]:
    from interlock.runtime.replaying import select_runs

    definition = await candidate(manifest)
    chosen = select_runs(await ops.list_runs(workflow), runs, since)
    return await _replaying(ops).shadow(chosen, definition, label=label_of(manifest))


async def fork(
    ops: InterlockClient,
    records: list[ev.AnyRecord],
    at: int,
    version: int | None,
    new: str,
) -> str:
    from interlock.runtime.replaying import RunExistsAlready

    replaying = _replaying(ops)
    definition = None
    if version is not None:
        state = fold(records)
        definition = await replaying.definition(state.namespace, state.workflow, version)
    check_run_id(new)
    try:
        forked = await replaying.fork(
            records, at, run_id=new, definition=definition, version=version
        )
    except RunExistsAlready:
        raise RunExists(new) from None
    return forked.run_id


async def migrate(ops: InterlockClient, workflow: str, to: int, *, dry_run: bool) -> dict[str, Any]:
    from interlock.runtime.replaying import in_flight

    namespace, _, name = workflow.rpartition("/")
    replaying = _replaying(ops)
    definition = await replaying.definition(namespace or "default", name, to)
    running = in_flight(await ops.list_runs(workflow, "running"), to)
    return await replaying.migrate(running, definition, to, dry_run=dry_run)


def read_text(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8")
