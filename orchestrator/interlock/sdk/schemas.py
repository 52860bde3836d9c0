"""Capability contracts: JSON Schemas from the decorator or from AgentDefs in the agents bucket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from interlock.transport.jetstream import connection
from interlock.transport.kvread import bucket_values, kv_prefix

log = logging.getLogger("interlock.sdk")

REFRESH_S = 30.0
"""Seconds between reads of the agents bucket when no write to it was heard."""


class _Validator(Protocol):
    def iter_errors(self, instance: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Schema:
    """A JSON Schema compiled once, checked many times."""

    source: Mapping[str, Any]
    _validator: _Validator

    @classmethod
    def compile(cls, schema: Mapping[str, Any], *, where: str) -> Schema:
        """Compile ``schema``; raises ValueError naming ``where`` if it is not a valid schema."""
        if not isinstance(schema, Mapping):
            # Bad content, not a bad call: callers catch ValueError.
            raise ValueError(f"{where}: a JSON Schema is an object, not {type(schema).__name__}")  # noqa: TRY004
        validator_cls = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        )
        try:
            validator_cls.check_schema(dict(schema))
        except jsonschema.exceptions.SchemaError as exc:
            raise ValueError(f"{where}: invalid JSON Schema: {exc.message}") from exc
        return cls(source=schema, _validator=validator_cls(dict(schema)))

    def problem(self, instance: Any) -> str | None:
        """The most relevant violation as ``<json path>: <message>``, or None when valid."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(instance))
        if error is None:
            return None
        return f"{error.json_path}: {error.message}"


@dataclass(frozen=True, slots=True)
class CapabilityContract:
    """The schemas a capability's input and output must match (either may be absent)."""

    input: Schema | None = None
    output: Schema | None = None
    origin: str = "decorator"


def contracts_from_agentdef(name: str, value: bytes) -> dict[str, CapabilityContract]:
    """Contracts declared by one stored AgentDef (the JSON of its ``spec``).

    Capabilities whose schemas do not compile are skipped with a warning: the orchestrator
    validates AgentDefs when they are applied, so this only guards against a stray write.
    """
    try:
        doc = json.loads(value)
    except ValueError as exc:
        log.warning("AgentDef %r in the agents bucket is not JSON: %s", name, exc)
        return {}
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
        doc = doc["spec"]  # a whole manifest rather than its spec
    caps = doc.get("capabilities") if isinstance(doc, dict) else None
    if not isinstance(caps, list):
        log.warning("AgentDef %r has no 'capabilities' list; ignored", name)
        return {}
    out: dict[str, CapabilityContract] = {}
    for cap in caps:
        if not isinstance(cap, dict) or not isinstance(cap.get("name"), str):
            continue
        cap_name = cap["name"]
        try:
            contract = CapabilityContract(
                input=_maybe_compile(cap.get("input_schema"), f"{name}/{cap_name} input_schema"),
                output=_maybe_compile(cap.get("output_schema"), f"{name}/{cap_name} output_schema"),
                origin=f"AgentDef {name}",
            )
        except ValueError as exc:
            log.warning("AgentDef %r: %s; capability %r ignored", name, exc, cap_name)
            continue
        out[cap_name] = contract
    return out


def _maybe_compile(schema: Any, where: str) -> Schema | None:
    return None if schema is None else Schema.compile(schema, where=where)


class AgentDefCatalog:
    """Contracts of every capability declared in the agents KV bucket, kept current by
    :meth:`follow`."""

    def __init__(self) -> None:
        # Each AgentDef's stored value and the contracts compiled from it.
        self._defs: dict[str, tuple[bytes, dict[str, CapabilityContract]]] = {}
        self._by_capability: dict[str, CapabilityContract] = {}

    def get(self, capability: str) -> CapabilityContract | None:
        return self._by_capability.get(capability)

    def replace(self, stored: Mapping[str, bytes]) -> None:
        """Take ``stored`` (every AgentDef's value by name) as the whole bucket: AgentDefs
        not in it are dropped, and only those whose value changed are compiled again."""
        defs: dict[str, tuple[bytes, dict[str, CapabilityContract]]] = {}
        for name, value in stored.items():
            known = self._defs.get(name)
            if known is None or known[0] != value:
                known = (value, contracts_from_agentdef(name, value))
            defs[name] = known
        self._defs = defs
        merged: dict[str, CapabilityContract] = {}
        for def_name in sorted(self._defs):  # deterministic when two AgentDefs overlap
            merged.update(self._defs[def_name][1])
        self._by_capability = merged

    async def follow(
        self, js: Any, bucket: str, loaded: asyncio.Event, *, refresh: float = REFRESH_S
    ) -> None:
        """Load the bucket, set ``loaded``, then keep it current until cancelled.

        No watch: a watch is a consumer, and an agent may make none (a stream takes at
        most 1,000, and one agent making them would leave none for the orchestrator and
        the other agents). The bucket is read by direct gets
        (:func:`~interlock.transport.kvread.bucket_values`), and read again whenever a
        write to it is heard on its subjects (a plain subscription), and every
        ``refresh`` seconds for writes made while the connection was down. A missing
        bucket is retried: the orchestrator may provision it after we start.
        """
        changed = asyncio.Event()

        async def heard(_msg: Any) -> None:
            changed.set()

        kv = sub = None
        delay = 0.5
        try:
            while True:
                try:
                    if kv is None:
                        kv = await js.key_value(bucket)
                    if sub is None:
                        sub = await connection(js).subscribe(f"{kv_prefix(kv)}>", cb=heard)
                    changed.clear()
                    stored = await bucket_values(kv)
                # The bucket does not exist yet, NATS is reconnecting, or the credential
                # may not read the bucket (one issued before it was read by direct gets).
                except Exception as exc:  # noqa: BLE001
                    level = logging.WARNING if delay >= 10.0 else logging.DEBUG
                    log.log(
                        level,
                        "cannot read the AgentDefs (bucket %r): %s; checking the decorator's "
                        "schemas only, retrying",
                        bucket,
                        exc or type(exc).__name__,
                    )
                    loaded.set()  # nothing to wait for: run with the decorator's schemas
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                delay = 0.5
                self.replace(stored)
                loaded.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), refresh)
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):  # the connection may be closed already
                    await sub.unsubscribe()
