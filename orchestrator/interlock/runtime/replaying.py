"""Forks and migrations against a running installation; the analyses themselves are pure
(:mod:`interlock.core.analysis`), this module reads logs and appends the results.

Both append optimistically, like every other writer of run logs: a fork's log is written
in one append that expects an empty subject (so an existing run id is refused, never
overwritten), a migration expects the log's last sequence as it was read (so a run that
moved meanwhile is checked again).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition
from interlock.core.migrating import slots_moved
from interlock.core.state import fold
from interlock.core.vocabulary import RunStatus
from interlock.runtime.errors import RunExists, UnknownWorkflow
from interlock.runtime.logstore import RunLog
from interlock.runtime.registry import Registry
from interlock.transport.errors import AppendConflict

Loader = Callable[[list[ev.AnyRecord]], Awaitable[list[ev.AnyRecord]]]

MIGRATE_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class Forked:
    run_id: str
    records: list[ev.AnyRecord]
    version: int


class Replaying:
    """Reading runs with the definitions they ran, forking them and migrating them."""

    def __init__(
        self,
        log: RunLog,
        registry: Registry,
        clock: Callable[[], str],
        loaded: Loader | None = None,
    ) -> None:
        self.log = log
        self.registry = registry
        self.clock = clock
        self._loaded = False
        self._payloads = loaded
        """Loads the payloads a log keeps by reference (shadow decides on the values)."""

    async def load_capabilities(self) -> None:
        if not self._loaded:
            await self.registry.load()
            self._loaded = True

    async def definition(self, namespace: str, name: str, version: int) -> Definition:
        """A version of a workflow as the orchestrator runs it (linked with its AgentDefs)."""
        await self.load_capabilities()
        return self.registry.link(await self.registry.definition(namespace, name, version))

    async def latest(self, ref: str) -> tuple[Definition, int]:
        await self.load_capabilities()
        definition, version = await self.registry.latest(ref)
        return self.registry.link(definition), version

    async def ran(self, records: Sequence[ev.AnyRecord]) -> Definition:
        """The definition a run is on (the version its log names)."""
        state = fold(records)
        return await self.definition(state.namespace, state.workflow, state.version)

    async def explain(
        self, records: Sequence[ev.AnyRecord], *, at: int | None = None
    ) -> dict[str, Any]:
        """``analysis.explain`` with the version the run is on, each step weighed by the
        version in force when it was decided."""
        state = fold(records)
        definition = await self.ran(records)
        versions: dict[int, Definition] = {}
        for number in analysis.versions_named(records):
            with contextlib.suppress(UnknownWorkflow):
                versions[number] = await self.definition(state.namespace, state.workflow, number)
        # Re-deciding a long log is seconds of CPU: off the event loop, so a process that
        # serves others meanwhile (the HTTP gateway) keeps answering them.
        return await asyncio.to_thread(
            analysis.explain, records, definition, at=at, versions=versions
        )

    async def named(
        self, records: Sequence[ev.AnyRecord], ref: str | int
    ) -> tuple[Definition, int, str]:
        """A stored version named as ``3``, ``v3`` or ``[ns/]name@3`` (default: the run's
        workflow), with its number and a label."""
        state = fold(records)
        text = str(ref)
        name, _, number_text = text.rpartition("@")
        number = parse_version(number_text)
        if number is None:
            raise ValueError(f"{text!r}: not VERSION or WORKFLOW@VERSION")
        namespace, _, short = (name or f"{state.namespace}/{state.workflow}").rpartition("/")
        namespace = namespace or "default"
        definition = await self.definition(namespace, short, number)
        return definition, number, f"{namespace}/{short}@{number}"

    async def shadow(
        self, run_ids: Iterable[str], candidate: Definition, *, label: str = ""
    ) -> dict[str, Any]:
        """``analysis.shadow`` over stored runs, read and replayed one at a time."""
        await self.load_capabilities()
        summary = analysis.Shadow(self.registry.link(candidate), label=label)
        for run_id in run_ids:
            records, _ = await self.log.read(run_id)
            if self._payloads is not None:
                records = await self._payloads(records)
            summary.add(records)
        return summary.summary()

    async def fork(
        self,
        records: Sequence[ev.AnyRecord],
        at: int,
        *,
        run_id: str,
        definition: Definition | None = None,
        version: int | None = None,
        paused: bool = False,
    ) -> Forked:
        """Start run ``run_id`` from the first ``at`` records of ``records``, on
        ``definition`` (default: the version the original ran)."""
        state = fold(records)
        if definition is None:
            version = state.version
            definition = await self.definition(state.namespace, state.workflow, state.version)
        assert version is not None
        made = analysis.fork(
            records,
            at,
            run_id=run_id,
            definition=definition,
            version=version,
            now=self.clock(),
            paused=paused,
        )
        try:
            await self.log.append(run_id, made, 0)
        except AppendConflict:
            raise RunExists(run_id, nothing_was="forked") from None
        return Forked(run_id, made, version)

    async def migrate(
        self,
        run_ids: Sequence[str],
        definition: Definition,
        version: int,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Move each run whose log agrees with ``definition`` so far onto ``version``;
        list the others with the reason."""
        moved: list[dict[str, Any]] = []
        stayed: list[dict[str, Any]] = []
        for run_id in run_ids:
            outcome = await self._migrate_one(run_id, definition, version, dry_run=dry_run)
            (stayed if outcome.get("reason") else moved).append(outcome)
        return {
            "workflow": {"name": definition.name, "namespace": definition.namespace},
            "to": {"version": version, "spec_hash": definition.spec_hash},
            "dry_run": dry_run,
            "moved": moved,
            "stayed": stayed,
        }

    async def _migrate_one(
        self, run_id: str, definition: Definition, version: int, *, dry_run: bool
    ) -> dict[str, Any]:
        for _ in range(MIGRATE_ATTEMPTS):
            records, last = await self.log.read(run_id, consistent=True)
            if not records:
                return {"run_id": run_id, "reason": "no such run"}
            state = fold(records)
            base = {"run_id": run_id, "from_version": state.version, "state": state.state}
            made, report = analysis.migration(
                records, definition, version=version, now=self.clock()
            )
            if not made:
                out = {**base, "reason": report["migrate"]}
                if report["divergence"] is not None:
                    d = report["divergence"]
                    out["divergence"] = {k: d[k] for k in ("seq", "kind", "reason")}
                return out
            moved = {**base, "reason": None, "seq": state.seq + 1, **slots_moved(state, made)}
            if dry_run:
                return moved
            try:
                await self.log.append(run_id, made, last)
            except AppendConflict:
                continue  # the run moved meanwhile: check it again
            return moved
        return {"run_id": run_id, "reason": "the run kept moving; try again"}


def select_runs(
    listed: Sequence[dict[str, Any]], runs: int | None = None, since: str | None = None
) -> list[str]:
    """Run ids from the run index (oldest first): started at or after ``since``, the
    ``runs`` most recent."""
    chosen = sorted(listed, key=lambda r: str(r.get("started_at", "")))
    if since:
        chosen = [r for r in chosen if str(r.get("started_at", "")) >= since]
    if runs is not None:
        chosen = chosen[-runs:] if runs > 0 else []
    return [str(r["run_id"]) for r in chosen]


def in_flight(listed: Sequence[dict[str, Any]], version: int) -> list[str]:
    """Run ids from the run index that are running on another version than ``version``."""
    return [
        str(r["run_id"])
        for r in listed
        if r.get("status") == RunStatus.RUNNING and int(r.get("version", 0)) != version
    ]


def compile_manifest(name: str, text: str) -> Definition:
    """The one workflow of a manifest; ValueError naming each problem (file:line:col)."""
    compiled = compile_sources([(name, text)])
    if not compiled.ok:
        raise ValueError("\n".join(str(d) for d in compiled.diagnostics))
    if len(compiled.workflows) != 1:
        raise ValueError(f"{name}: holds {len(compiled.workflows)} workflows, not one")
    return compiled.workflows[0]


def parse_version(text: str) -> int | None:
    """``3`` or ``v3`` as a version number, else None."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    return int(digits) if digits.isdigit() else None


__all__ = [
    "Forked",
    "Replaying",
    "UnknownWorkflow",
    "compile_manifest",
    "in_flight",
    "parse_version",
    "select_runs",
]
