"""Debugging by replay (docs/debugging.md): each function returns the report documented
there. They compile definitions, so the compiler is loaded here and nowhere else in the
client."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.core.ids import check_run_id
from interlock.core.state import fold
from interlock.core.vocabulary import RunStatus

if TYPE_CHECKING:
    from interlock.core import events as ev
    from interlock.core.definition import Definition
    from interlock.runtime.client import InterlockClient
    from interlock.runtime.replaying import Replaying

Manifest = str | Path | tuple[str, str]
"""A manifest file, or a ``(name, text)`` pair."""


def _replaying(ops: InterlockClient) -> Replaying:
    from interlock.runtime.replaying import Replaying

    return Replaying(ops.log, ops.registry, ops.runs.clock, ops.payloads.loaded)


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
    from datetime import UTC, datetime

    from interlock.core.rfc3339 import since as moment
    from interlock.runtime.replaying import select_runs

    since = None if since is None else moment(since, datetime.now(UTC))
    definition = await candidate(manifest)
    chosen = select_runs(await ops.list_runs(workflow), runs, since)
    return await _replaying(ops).shadow(chosen, definition, label=label_of(manifest))


async def fork(
    ops: InterlockClient,
    records: list[ev.AnyRecord],
    at: int,
    version: int | None,
    new: str,
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Fork the run of ``records`` at ``at`` as ``new`` (on ``version``, else the version it
    ran); with ``dry_run``, what the fork would be, nothing written. The report of
    ``interlock fork --json`` (:func:`fork_report`)."""
    from interlock.core import analysis

    replaying = _replaying(ops)
    state = fold(records)
    check_run_id(new)
    chosen = state.version if version is None else version
    definition = await replaying.definition(state.namespace, state.workflow, chosen)
    paused = await workflow_paused(ops, state.namespace, state.workflow)
    if dry_run:
        made = analysis.fork(
            records,
            at,
            run_id=new,
            definition=definition,
            version=chosen,
            now=replaying.clock(),
            paused=paused,
        )
        return fork_report(state.run_id, at, new, chosen, made, dry_run=True)
    forked = await replaying.fork(
        records, at, run_id=new, definition=definition, version=chosen, paused=paused
    )
    return fork_report(state.run_id, at, forked.run_id, forked.version, forked.records)


async def workflow_paused(ops: InterlockClient, namespace: str, name: str) -> bool:
    """Whether the workflow is paused now: a fork of it waits for its resumption, as a run
    started now does."""
    from interlock.runtime.pausing import Pauses

    return await Pauses(ops.nc, ops.subjects).paused(namespace, name) is not None


def fork_report(
    origin: str,
    at: int,
    run_id: str,
    version: int,
    records: Sequence[ev.AnyRecord],
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    """A fork as ``interlock fork --json`` reports it: the new run, its origin, its
    version, the state it goes on in, and its records after the origin's first ``at``."""
    from interlock.core import events as ev
    from interlock.core.record_text import record_line

    marker = next(r for r in records if isinstance(r, ev.RunForked))
    return {
        "run_id": run_id,
        "origin": {"run_id": origin, "seq": at},
        "version": version,
        "state": marker.data.state,
        "records": [record_line(i, r) for i, r in enumerate(records, start=1) if i > at],
        "dry_run": dry_run,
    }


async def migrate(ops: InterlockClient, workflow: str, to: int, *, dry_run: bool) -> dict[str, Any]:
    from interlock.runtime.replaying import in_flight

    namespace, _, name = workflow.rpartition("/")
    replaying = _replaying(ops)
    definition = await replaying.definition(namespace or "default", name, to)
    running = in_flight(await ops.list_runs(workflow, RunStatus.RUNNING), to)
    return await replaying.migrate(running, definition, to, dry_run=dry_run)


def read_text(path: str | Path) -> str:
    return Path(path).read_text(encoding="utf-8")
