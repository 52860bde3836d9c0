"""Workflow and AgentDef registry in JetStream KV.

Workflows are versioned: ``wf.<namespace>.<name>.<version>`` holds each version's manifest
(never overwritten; JSON ``{"version", "spec_hash", "manifest", "outline"}``, the outline
what readers show without compiling: :mod:`interlock.views.outline`) and
``latest.<namespace>.<name>`` names the newest. Applying a changed manifest makes a new
version; runs keep the version they started with because a run's first record names it.
AgentDefs are stored by name as their spec (what agent workers read to validate their
input and output).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from interlock.runtime.errors import UnknownWorkflow
from interlock.runtime.foreign import NOT_WRITTEN_HERE as NOT_OURS
from interlock.runtime.foreign import (
    agent_spec,
    bucket_object,
    entry_object,
    pointed_version,
    version_of,
    workflow_body,
)
from interlock.runtime.revisions import Revisions
from interlock.runtime.settings import HISTORY_KEY, HistorySetting
from interlock.runtime.versions import Applied, StoredWorkflow, store_version
from interlock.transport.cancelling import cancel_and_wait
from interlock.transport.kvread import bucket_values
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.core.compiler import WebhookDefinition
    from interlock.core.definition import AgentDefinition, CapabilityDef, Definition
    from interlock.runtime.schemas import CapabilitySchemas

# The compiler (and jsonschema) are imported where a definition is compiled or a schema
# checked, not above: a program that only lists workflows or reads runs through the
# registry (the CLI's read commands) does not load them.

_CLOSE_WAIT = 2.0
"""Seconds :meth:`Registry.close` waits for its watchers to end."""

log = logging.getLogger("interlock.registry")

READ_ATTEMPTS = 3
"""Times a read that timed out is asked (each within the JetStream context's timeout): a
stream's leader election in a cluster takes 4 to 7 s, more on a loaded machine."""


def _split(ref: str, namespace: str = "default") -> tuple[str, str]:
    """``ns/name``, or ``name`` in ``namespace`` ("default" unless given)."""
    if "/" in ref:
        ns, name = ref.split("/", 1)
        return ns, name
    return namespace, ref


class Registry:
    """Reads and writes definitions; keeps compiled ones and the trigger index in memory."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._workflows: KeyValue | None = None
        self._agents: KeyValue | None = None
        self._compiled: dict[tuple[str, str, int], Definition] = {}
        self._stored: dict[tuple[str, str, int], StoredWorkflow] = {}
        self._latest: dict[tuple[str, str], int] = {}
        self._capabilities: dict[str, CapabilityDef] = {}
        self._schemas: dict[str, CapabilitySchemas] = {}
        self._learners: list[Callable[[list[str]], None]] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._kv_watchers: list[Any] = []
        self.revisions = Revisions(js, self.load)
        """What the watchers have taken into account of each bucket; ``sync`` asks it."""
        self._agents_lock = asyncio.Lock()
        self.reads_asked_again = 0
        """Reads of the AgentDefs' revision asked again after a timeout."""
        self._agents_read: int | None = None
        """The agents bucket's last sequence when ``current_agents`` last read it."""
        self.retaining = False  # whether a workflow compiled here deletes its ended runs
        self.history = HistorySetting(self.workflows_kv)
        """The installation's history limits (:mod:`interlock.runtime.settings`)."""

    async def workflows_kv(self) -> KeyValue:
        """The workflows bucket (a reader needs no handle on the agents bucket)."""
        if self._workflows is None:
            self._workflows = await self._js.key_value(self._subjects.workflows_bucket)
        return self._workflows

    async def _kv(self) -> tuple[KeyValue, KeyValue]:
        if self._agents is None:
            self._agents = await self._js.key_value(self._subjects.agents_bucket)
        return await self.workflows_kv(), self._agents

    # -- writing -------------------------------------------------------------------------

    async def apply_workflow(self, definition: Definition) -> Applied:
        workflows, _ = await self._kv()
        ns, name = definition.namespace, definition.name
        latest_key = f"latest.{ns}.{name}"
        mine = 0  # the version this call stored, if it had to read the pointer again
        while True:
            try:
                entry = await workflows.get(latest_key)
                # A pointer Interlock did not write is replaced, as a missing one would be.
                pointer = entry_object(self._subjects.workflows_bucket, entry) or {}
                revision = entry.revision
            except KeyNotFoundError:
                pointer, revision = {}, None
            pointed = version_of(pointer)
            if pointed is not None and pointer.get("spec_hash") == definition.spec_hash:
                return Applied("Workflow", ns, name, pointed, False)
            current = pointed or 0
            version = (
                mine
                if mine > current
                else await store_version(
                    workflows, self._subjects.workflows_bucket, definition, current + 1
                )
            )
            mine = version
            new_pointer = json.dumps({"version": version, "spec_hash": definition.spec_hash})
            try:
                if revision is None:
                    await workflows.create(latest_key, new_pointer.encode())
                else:
                    await workflows.update(latest_key, new_pointer.encode(), last=revision)
            except KeyWrongLastSequenceError:
                continue  # someone applied at the same time: read again and decide again
            except Exception as exc:  # create() on an existing key
                if "wrong last sequence" in str(exc).lower():
                    continue
                raise
            self._latest[(ns, name)] = version
            self._compiled[(ns, name, version)] = definition
            return Applied("Workflow", ns, name, version, True)

    async def apply_agent(self, agent: AgentDefinition) -> Applied:
        _, agents = await self._kv()
        spec = dict(agent.manifest.get("spec", {}))
        body = json.dumps(spec, sort_keys=True).encode()
        try:
            current = await agents.get(agent.name)
            if current.value == body:
                return Applied(
                    "AgentDef", agent.namespace, agent.name, current.revision or 0, False
                )
        except KeyNotFoundError:
            pass
        revision = await agents.put(agent.name, body)
        for cap in agent.capabilities.values():
            self._know_capability(cap)
        return Applied("AgentDef", agent.namespace, agent.name, revision, True)

    async def apply_webhook(self, webhook: WebhookDefinition) -> Applied:
        """Store a Webhook's manifest under ``<namespace>.<name>`` (unchanged: no write)."""
        kv = await self._js.key_value(self._subjects.webhooks_bucket)
        key = f"{webhook.namespace}.{webhook.name}"
        body = json.dumps(webhook.manifest, sort_keys=True).encode()
        try:
            current = await kv.get(key)
            if current.value == body:
                return Applied(
                    "Webhook", webhook.namespace, webhook.name, current.revision or 0, False
                )
        except KeyNotFoundError:
            pass
        revision = await kv.put(key, body)
        return Applied("Webhook", webhook.namespace, webhook.name, revision, True)

    async def webhook(self, namespace: str, name: str) -> WebhookDefinition | None:
        """The applied Webhook ``namespace/name``, or None."""
        kv = await self._js.key_value(self._subjects.webhooks_bucket)
        try:
            entry = await kv.get(f"{namespace}.{name}")
        except KeyNotFoundError:
            return None
        body = entry_object(self._subjects.webhooks_bucket, entry) if entry.value else None
        if body is None:
            return None  # none, or not one Interlock wrote (reported)
        from interlock.core.compiler import compile_webhook_data

        return compile_webhook_data(body, f"<webhook {namespace}/{name}>")

    # -- reading -------------------------------------------------------------------------

    async def definition(self, namespace: str, name: str, version: int) -> Definition:
        key = (namespace, name, version)
        found = self._compiled.get(key)
        if found is not None:
            return found
        body = await self._stored_body(namespace, name, version)
        return self._compile(namespace, name, version, body)

    def _compile(self, namespace: str, name: str, version: int, body: dict[str, Any]) -> Definition:
        from interlock.core.compiler import compile_workflow_data

        definition = compile_workflow_data(body["manifest"], f"<{namespace}/{name}@{version}>")
        self._compiled[(namespace, name, version)] = definition
        self.retaining = self.retaining or definition.retention_s is not None
        return definition

    async def _stored_body(self, namespace: str, name: str, version: int) -> dict[str, Any]:
        try:
            entry = await (await self.workflows_kv()).get(f"wf.{namespace}.{name}.{version}")
        except KeyNotFoundError:
            raise UnknownWorkflow(
                f"workflow {namespace}/{name} version {version} is not applied"
            ) from None
        body = workflow_body(self._subjects.workflows_bucket, entry)
        if body is None:
            raise UnknownWorkflow(f"workflow {namespace}/{name} version {version}: {NOT_OURS}")
        return body

    async def stored(
        self, namespace: str, name: str, version: int, *, complete: bool = False
    ) -> StoredWorkflow:
        """Version ``version`` of a workflow as stored, with its outline, compiling
        nothing (unless it was stored without an outline, or, ``complete``, without what
        its states ask for: by an older version)."""
        from interlock.views.outline import decode_outline, outline_of

        key = (namespace, name, version)
        found = self._stored.get(key)
        if found is None or (complete and found.outline.asks is None):
            compiled = self._compiled.get(key)
            body = await self._stored_body(*key)
            outline = decode_outline(body.get("outline"))
            if outline is None or (complete and outline.asks is None):
                compiled = compiled or self._compile(namespace, name, version, body)
                body = {**body, "spec_hash": compiled.spec_hash, "manifest": compiled.manifest}
                outline = outline_of(compiled)
            manifest, source = body.get("manifest"), body.get("source")
            found = self._stored[key] = StoredWorkflow(
                *key,
                spec_hash=str(body.get("spec_hash", "")),
                manifest=manifest if isinstance(manifest, Mapping) else {},
                outline=outline,
                source=source if isinstance(source, str) else "",
            )
        return found

    async def stored_latest(self, ref: str) -> StoredWorkflow:
        """The newest version of ``ns/name`` (or ``name``) as :meth:`stored` reads it."""
        ns, name = _split(ref)
        return await self.stored(ns, name, await self._latest_version(ns, name, "/" in ref))

    async def latest(self, ref: str, namespace: str = "default") -> tuple[Definition, int]:
        """The newest version of ``ns/name`` (or ``name`` in ``namespace``)."""
        ns, name = _split(ref, namespace)
        version = await self._latest_version(ns, name, "/" in ref)
        return await self.definition(ns, name, version), version

    async def _latest_version(self, ns: str, name: str, named: bool = True) -> int:
        try:
            entry = await (await self.workflows_kv()).get(f"latest.{ns}.{name}")
        except KeyNotFoundError:
            # A name alone means the default namespace (a ctxmesh file names its own).
            hint = "" if named else f"; another namespace's: NAMESPACE/{name}, interlock workflows"
            raise UnknownWorkflow(
                f"workflow {ns}/{name} is not applied (interlock apply FILE{hint})"
            ) from None
        version = pointed_version(self._subjects.workflows_bucket, entry)
        if version is None:
            raise UnknownWorkflow(f"workflow {ns}/{name}: {NOT_OURS}")
        self._latest[(ns, name)] = version
        return version

    async def workflows(self) -> list[dict[str, Any]]:
        workflows, _ = await self._kv()
        out = []
        for key, value in (await bucket_values(workflows)).items():
            if key.startswith("latest."):
                _, ns, name = key.split(".", 2)
                pointer = bucket_object(self._subjects.workflows_bucket, key, value)
                if version_of(pointer) is None:
                    continue  # not a pointer Interlock wrote (reported)
                out.append({**(pointer or {}), "namespace": ns, "name": name})
        return out

    async def agent_specs(self) -> dict[str, dict[str, Any]]:
        _, agents = await self._kv()
        bucket = self._subjects.agents_bucket
        values = (await bucket_values(agents)).items()
        # Those that are no AgentDef Interlock wrote are left out (reported).
        return {k: spec for k, v in values if (spec := agent_spec(bucket, k, v)) is not None}

    async def current_agents(self) -> None:
        """Make the AgentDefs known here current before a run is started with them.

        A registry that watches the buckets (the orchestrator's) is kept current by its
        watchers; one that does not (a CLI or another client that starts a run) reads the
        AgentDefs now. Either way a run started here links the same defaults (timeouts,
        retries) into its first actions as a run the orchestrator starts from a trigger.
        """
        if self._watchers:
            return
        async with self._agents_lock:  # concurrent starts share one read
            bucket = self._subjects.agents_bucket
            # Reads, asked again (all of them) through an election: the bucket's last
            # revision, then, if it moved, the AgentDefs.
            for attempt in range(READ_ATTEMPTS):
                try:
                    info = await self._js.stream_info(f"KV_{bucket}")
                    last = info.state.last_seq
                    if self._agents_read == last:
                        return  # nothing applied since the last read: one request, no consumer
                    specs = await self.agent_specs()
                    break
                except NatsTimeoutError:
                    if attempt == READ_ATTEMPTS - 1:
                        raise
                    self.reads_asked_again += 1
            for name, spec in specs.items():
                self._learn_agent(name, spec)
            self._agents_read = last

    def link(self, definition: Definition) -> Definition:
        """``definition`` with each action's unset timeout and retries taken from the
        AgentDef of its capability (see :func:`interlock.core.definition.link`)."""
        from interlock.core.definition import link

        return link(definition, self._capabilities)

    def capability(self, name: str) -> CapabilityDef | None:
        return self._capabilities.get(name)

    def schemas(self, name: str) -> CapabilitySchemas | None:
        """The capability's schemas, compiled when its AgentDef was learnt."""
        return self._schemas.get(name)

    def _know_capability(self, cap: CapabilityDef) -> None:
        if self._capabilities.get(cap.name) == cap and cap.name in self._schemas:
            return  # the same AgentDef again: its schemas are compiled already
        self._capabilities[cap.name] = cap
        import jsonschema

        from interlock.runtime.schemas import CapabilitySchemas, compile_schemas

        try:
            self._schemas[cap.name] = compile_schemas(cap.input_schema, cap.output_schema)
        except jsonschema.SchemaError as exc:
            log.warning("capability %s: invalid schema, not checked: %s", cap.name, exc)
            self._schemas[cap.name] = CapabilitySchemas()

    def state_waits(self, namespace: str, name: str, version: int, state: str) -> str:
        """What a state of a workflow version waits on, as the stuck-run gauge labels it:
        ``work`` (it asks for actions, a map, a loop or a child run), ``event`` (it waits
        for an event or a person: a human_in_the_loop state, or one with no work), or
        ``unknown`` (that version is not compiled here)."""
        definition = self._compiled.get((namespace, name, version))
        found = None if definition is None else definition.states.get(state)
        if found is None:
            return "unknown"
        # core.definition.HUMAN (imported, it would load the compiler into read commands).
        if found.kind == "human_in_the_loop" or not found.produces_output:
            return "event"
        return "work"

    def known_capabilities(self) -> set[str]:
        return set(self._capabilities)

    def correlating(self, event_type: str) -> Iterable[tuple[Definition, int]]:
        """Latest definitions whose ``correlate.events`` names ``event_type``."""
        for (ns, name), version in list(self._latest.items()):
            definition = self._compiled.get((ns, name, version))
            correlation = None if definition is None else definition.correlation
            if correlation is not None and event_type in correlation.events:
                assert definition is not None
                yield definition, version

    def triggered_by(self, event_type: str) -> Iterable[tuple[Definition, int]]:
        """Latest definitions with a trigger on ``event_type``."""
        for (ns, name), version in list(self._latest.items()):
            definition = self._compiled.get((ns, name, version))
            if definition is not None and any(t.event == event_type for t in definition.triggers):
                yield definition, version

    # -- keeping up to date --------------------------------------------------------------

    async def load(self) -> None:
        """Read every latest workflow and every AgentDef (done once at start)."""
        for item in await self.workflows():
            # One bad stored definition must not stop the others loading (logged there).
            with contextlib.suppress(Exception):
                await self.definition(item["namespace"], item["name"], int(item["version"]))
                self._latest[(item["namespace"], item["name"])] = int(item["version"])
        await self.load_agents()

    async def load_agents(self) -> None:
        """Read every AgentDef (their capabilities' timeouts and retries link into runs)."""
        for name, spec in (await self.agent_specs()).items():
            self._learn_agent(name, spec)

    def _learn_agent(self, name: str, spec: dict[str, Any]) -> None:
        from interlock.core.compiler import compile_agent_data

        try:
            agent = compile_agent_data(
                {
                    "apiVersion": "interlock.io/v1",
                    "kind": "AgentDef",
                    "metadata": {"name": name},
                    "spec": spec,
                }
            )
        # One bad definition must not stop the registry.
        except Exception as exc:  # noqa: BLE001
            log.warning("agent definition %s is not valid: %s", name, exc)
            return
        for cap in agent.capabilities.values():
            self._know_capability(cap)
        for learner in self._learners:
            learner(list(agent.capabilities))

    def on_capabilities(self, learner: Callable[[list[str]], None]) -> None:
        """Call ``learner`` with the capabilities of every AgentDef learnt from now on."""
        self._learners.append(learner)

    async def watch(self) -> None:
        """Follow changes applied by other processes (runs until cancelled)."""
        workflows, agents = await self._kv()
        self._watchers = [
            asyncio.create_task(self._watch_workflows(workflows)),
            asyncio.create_task(self._watch_agents(agents)),
        ]

    async def sync(self, *, agents: bool = False, timeout: float = 1.0) -> None:  # noqa: ASYNC109
        """Make sure every workflow (or AgentDef) stored before this call is known here.

        The watchers follow the buckets asynchronously, so a workflow applied just before an
        event was published may not have reached them when the event is routed: see
        :meth:`Revisions.sync`.
        """
        bucket = self._subjects.agents_bucket if agents else self._subjects.workflows_bucket
        await self.revisions.sync(bucket, timeout)

    def sync_soon(self, *, timeout: float = 1.0) -> asyncio.Future[None]:
        """:meth:`sync` of the workflows, its request sent in this call: its round trip
        overlaps whatever the caller does next (:meth:`Revisions.sync_soon`)."""
        return self.revisions.sync_soon(self._subjects.workflows_bucket, timeout)

    async def close(self) -> None:
        """Stop following the buckets. Bounded: the watchers are stopped (their
        subscriptions end) before their tasks are cancelled, and a task that still does not
        end is left behind rather than waited for."""
        for watcher in self._kv_watchers:
            with contextlib.suppress(Exception):  # the connection may be closed already
                await watcher.stop()
        await cancel_and_wait(*self._watchers, limit=_CLOSE_WAIT)

    async def _watch_workflows(self, kv: KeyValue) -> None:
        # Every key, not only the latest.* pointers: ``sync`` compares the revision seen
        # with the bucket's last one, whatever key that is.
        watcher = await kv.watchall()
        self._kv_watchers.append(watcher)
        async for entry in watcher:
            if entry is None:
                continue
            if entry.key == HISTORY_KEY:
                self.history.take(entry.value)
            elif entry.value and entry.key.startswith("latest."):
                try:
                    _, ns, name = entry.key.split(".", 2)
                    version = pointed_version(self._subjects.workflows_bucket, entry)
                    if version is not None:  # else reported
                        await self.definition(ns, name, version)
                        self._latest[(ns, name)] = version
                # One bad definition must not stop the registry.
                except Exception as exc:  # noqa: BLE001
                    log.warning("cannot load workflow %s: %s", entry.key, exc)
            await self.revisions.seen(self._subjects.workflows_bucket, entry.revision or 0)

    async def _watch_agents(self, kv: KeyValue) -> None:
        watcher = await kv.watchall()
        self._kv_watchers.append(watcher)
        async for entry in watcher:
            if entry is None:
                continue
            if entry.value:
                # One bad stored definition must not stop the others loading (logged there).
                spec = entry_object(self._subjects.agents_bucket, entry)
                with contextlib.suppress(Exception):
                    self._learn_agent(entry.key, spec or {})
            await self.revisions.seen(self._subjects.agents_bucket, entry.revision or 0)
