"""What the debugging commands (explain, replay, shadow, fork, migrate) read: exported run
logs, manifest files and the definitions named on the command line, and what they share in
printing a run's end."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.cli.common import EXIT_FAILED, CliError, err, read_records, read_sources
from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition, link
from interlock.core.state import fold

if TYPE_CHECKING:
    from interlock.runtime.replaying import Replaying


def read_log(path: str) -> list[ev.AnyRecord]:
    """The records of an exported log (``interlock export``); a clear error when it is none."""
    records = read_records(path)
    if not records:
        raise CliError(f"{path}: an empty log", EXIT_FAILED)
    return records


def manifest(path: str, agents: Sequence[str], name: str | None = None) -> Definition:
    """The one workflow in a manifest file, linked with the AgentDefs given."""
    compiled = compile_sources(read_sources([path]), agent_sources=read_sources(list(agents)))
    if not compiled.ok:
        for diagnostic in compiled.diagnostics:
            err(str(diagnostic))
        raise CliError(f"{path}: not a valid manifest", EXIT_FAILED)
    workflows = compiled.workflows
    if name is not None:
        short = name.rsplit("/", 1)[-1]
        workflows = [w for w in workflows if w.name == short] or workflows
    if len(workflows) != 1:
        raise CliError(f"{path}: holds {len(workflows)} workflows; give a file with one")
    capabilities = {
        cap_name: cap for agent in compiled.agents for cap_name, cap in agent.capabilities.items()
    }
    return link(workflows[0], capabilities) if capabilities else workflows[0]


def reference_agentdefs(capabilities: Sequence[str]) -> dict[str, list[str]]:
    """The manifest file of each reference agent serving some of ``capabilities`` (as
    installed with Interlock, for ``--agents``) -> those capabilities."""
    from importlib import resources

    import interlock_agents

    files: dict[str, list[str]] = {}
    for name in interlock_agents.REFERENCE_AGENTS:
        spec = interlock_agents.load_manifest(name).get("spec") or {}
        serves = {c.get("name") for c in spec.get("capabilities") or () if isinstance(c, dict)}
        mine = [c for c in capabilities if c in serves]
        if mine:
            path = resources.files(interlock_agents).joinpath("manifests", f"{name}.yaml")
            files[str(path)] = mine
    return files


def is_online(args: argparse.Namespace) -> bool:
    """Whether the command talks to a server (no ``--file`` given)."""
    return not getattr(args, "file", None)


def replaying_of(client: Any) -> Replaying:
    """The server-side replays over a connected client's log and registry."""
    from interlock.runtime.replaying import Replaying
    from interlock.transport.clock import utc_now

    return Replaying(client.ops.log, client.ops.registry, utc_now, client.ops.payloads.loaded)


async def definition_against(
    replaying: Replaying,
    records: Sequence[ev.AnyRecord],
    value: str,
    agents: Sequence[str],
    *,
    is_file: bool,
) -> tuple[Definition, int, str]:
    """A definition named on the command line: a file, WORKFLOW@VERSION or VERSION."""
    if is_file:
        definition = manifest(value, agents, fold(records).workflow)
        await replaying.load_capabilities()
        return replaying.registry.link(definition), 0, value
    try:
        return await replaying.named(records, value)
    except ValueError as exc:
        raise CliError(f"{value}: not a file, WORKFLOW@VERSION or VERSION") from exc


def headed_logs(paths: Sequence[str]) -> list[tuple[str, ev.AnyRecord]]:
    """Each log file in ``paths`` (files, or folders of ``*.jsonl``) with its first record."""
    files: list[str] = []
    for path in paths:
        if Path(path).is_dir():
            files += sorted(str(p) for p in Path(path).glob("*.jsonl"))
        else:
            files.append(path)
    out = []
    for path in files:
        try:
            with Path(path).open("rb") as handle:
                first = handle.readline()
        except OSError as exc:
            raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        try:
            out.append((path, ev.decode(first)))
        except Exception as exc:
            raise CliError(f"{path}: not a run log: {exc}", EXIT_FAILED) from exc
    return out


def starts_workflow(first: ev.AnyRecord, ref: str) -> bool:
    """Whether ``first`` starts a run of ``ref`` (NAME or NAMESPACE/NAME)."""
    if not isinstance(first, ev.RunStarted):
        return False
    d = first.data
    return ref in (d.workflow, f"{d.namespace}/{d.workflow}")


def now() -> str:
    """The time records written now carry (RFC 3339, UTC)."""
    from interlock.transport.clock import utc_now

    return utc_now()


def end_text(end: dict[str, Any]) -> str:
    """How a report's run ended, on one line: status, state, outputs or error."""
    if not end["state"]:  # it entered no state: its start was refused, or it is queued
        return "never started" if end["status"] == "new" else f"{end['status']}, in no state yet"
    text = f"{end['status']} in {end['state']}"
    if "outputs" in end:
        text += f" outputs={analysis.short(end['outputs'])}"
    if "error" in end:
        text += f" ({end['error']['class']}: {end['error']['message']})"
    return text
