"""What is applied: workflows and their versions, AgentDefs and the workers serving them,
read from the buckets as stored (listing compiles nothing), and a workflow deleted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from interlock.client.errors import UnknownAgent
from interlock.runtime.applied import Catalog
from interlock.runtime.buckets import live_workers
from interlock.runtime.errors import UnknownWorkflow
from interlock.runtime.pausing import Pauses
from interlock.transport.kvread import bucket_values, stored_keys
from interlock.views import AgentView, WorkflowDetail, WorkflowSummary
from interlock.views.build import agent_view, workflow_detail_of, workflow_summary_of
from interlock.views.pauses import WorkflowPause

if TYPE_CHECKING:
    from interlock.core.definition import Definition
    from interlock.core.state import RunState
    from interlock.runtime.client import InterlockClient
    from interlock.views.outline import WorkflowOutline


async def catalog(ops: InterlockClient) -> Catalog:
    """(namespace, name) -> (newest version, spec hash, manifest) of every workflow
    applied (nothing is compiled): the whole workflows bucket on a client's first call,
    then only the records stored since its last (``ops.applied``, which ``emit`` reads
    too), so a client that lists again and again (a gateway, a console) asks one request
    when nothing was applied, however many workflows and versions are stored."""
    return await ops.applied.current()


async def workflows(ops: InterlockClient) -> list[WorkflowSummary]:
    """The newest version of every workflow applied, by namespace and name."""
    applied = await catalog(ops)
    paused = await Pauses(ops.nc, ops.subjects).every()
    out = [
        msgspec.structs.replace(
            workflow_summary_of(ns, name, version, spec_hash, manifest),
            paused=WorkflowPause.of(paused.get(f"{ns}/{name}")),
        )
        for (ns, name), (version, spec_hash, manifest) in applied.items()
    ]
    return sorted(out, key=lambda w: (w.namespace, w.name))


async def workflow(ops: InterlockClient, name: str, version: int | None) -> WorkflowDetail:
    """Workflow ``name`` with its versions and the manifest of ``version`` (the newest by
    default). Raises :class:`UnknownWorkflow`."""
    try:
        if version is not None:
            namespace, _, short = name.rpartition("/")
            found = await ops.registry.stored(namespace or "default", short, version)
        else:
            found = await ops.registry.stored_latest(name)
    except (BucketNotFoundError, NotFoundError):
        if version is not None:
            raise UnknownWorkflow(f"workflow {name} version {version} is not applied") from None
        raise UnknownWorkflow(f"workflow {name} is not applied (interlock apply FILE)") from None
    stored = await versions(ops, found.namespace, found.name)
    pause = await Pauses(ops.nc, ops.subjects).paused(found.namespace, found.name)
    detail = workflow_detail_of(
        found.namespace,
        found.name,
        found.version,
        stored or [found.version],
        spec_hash=found.spec_hash,
        manifest=found.manifest,
        outline=found.outline,
        source=found.source,
    )
    return msgspec.structs.replace(detail, paused=WorkflowPause.of(pause))


async def delete_workflow(ops: InterlockClient, name: str) -> int:
    """Drop the pointer to the newest version of ``name`` (its versions stay stored);
    returns that version. Raises :class:`UnknownWorkflow`."""
    try:
        found = await ops.registry.stored_latest(name)
    except (BucketNotFoundError, NotFoundError):
        raise UnknownWorkflow(f"workflow {name} is not applied (interlock apply FILE)") from None
    kv = await ops.js.key_value(ops.subjects.workflows_bucket)
    await kv.delete(f"latest.{found.namespace}.{found.name}")
    return found.version


async def agents(ops: InterlockClient, name: str | None = None) -> list[AgentView]:
    """Every AgentDef (or the one named ``name``) with the live workers of its capabilities
    and their queues. Raises :class:`UnknownAgent` when ``name`` names none."""
    specs, workers = await agent_data(ops)
    if name is not None:
        if name not in specs:
            raise UnknownAgent(f"no AgentDef named {name!r} (interlock apply FILE)")
        specs = {name: specs[name]}
    depths = await queues(ops, specs.values())
    return [agent_view(n, spec, workers, depths) for n, spec in sorted(specs.items())]


async def versions(ops: InterlockClient, namespace: str, name: str) -> list[int]:
    """Every version of ``namespace/name`` stored, oldest first."""
    kv = await ops.registry.workflows_kv()
    prefix = f"wf.{namespace}.{name}."
    stored = await stored_keys(kv, f"{prefix}*")
    return sorted(int(tail) for key in stored if (tail := key[len(prefix) :]).isdigit())


async def agent_data(
    ops: InterlockClient,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Every AgentDef's spec by name, and the live workers (one entry per process)."""
    try:
        specs = await ops.registry.agent_specs()
    except (BucketNotFoundError, NotFoundError):
        specs = {}
    try:
        kv = await ops.js.key_value(ops.subjects.workers_bucket)
        heartbeats = await bucket_values(kv)
    except (BucketNotFoundError, NotFoundError):
        heartbeats = {}
    return specs, live_workers(heartbeats)


async def queues(
    ops: InterlockClient, specs: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[int, int]]:
    """(waiting, in progress) task requests of each capability of ``specs`` whose consumer
    exists (the orchestrator makes it on its first request)."""
    from interlock.transport.tasks import consumer_name

    out: dict[str, tuple[int, int]] = {}
    for spec in specs:
        for cap in spec.get("capabilities", []):
            name = str(cap.get("name", "")) if isinstance(cap, Mapping) else ""
            if not name or name in out:
                continue
            try:
                info = await ops.js.consumer_info(ops.subjects.tasks_stream, consumer_name(name))
            except (NotFoundError, ValueError):
                continue
            out[name] = (int(info.num_pending or 0), int(info.num_ack_pending or 0))
    return out


async def outline_of_run(ops: InterlockClient, state: RunState) -> WorkflowOutline | None:
    """The outline of the definition a run runs, or None when it is not stored any more
    (compiles nothing: see :mod:`interlock.views.outline`)."""
    try:
        stored = await ops.registry.stored(state.namespace, state.workflow, state.version)
    except (UnknownWorkflow, KeyNotFoundError, BucketNotFoundError, NotFoundError):
        return None
    return stored.outline


async def definition_of(ops: InterlockClient, state: RunState) -> Definition | None:
    """The definition a run runs (compiled), or None when it is not stored any more."""
    try:
        return await ops.registry.definition(state.namespace, state.workflow, state.version)
    except (UnknownWorkflow, KeyNotFoundError, BucketNotFoundError, NotFoundError):
        return None
