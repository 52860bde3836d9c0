"""Capability contracts: JSON Schemas from the decorator or from AgentDefs in the agents bucket."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

log = logging.getLogger("interlock.sdk")


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
    """Contracts of every capability declared in the agents KV bucket, kept current by a watch."""

    def __init__(self) -> None:
        self._by_def: dict[str, dict[str, CapabilityContract]] = {}
        self._by_capability: dict[str, CapabilityContract] = {}

    def get(self, capability: str) -> CapabilityContract | None:
        return self._by_capability.get(capability)

    def apply(self, name: str, value: bytes | None) -> None:
        """Record a put (``value``) or a delete (None) of the AgentDef ``name``."""
        if value:
            self._by_def[name] = contracts_from_agentdef(name, value)
        else:
            self._by_def.pop(name, None)
        merged: dict[str, CapabilityContract] = {}
        for def_name in sorted(self._by_def):  # deterministic when two AgentDefs overlap
            merged.update(self._by_def[def_name])
        self._by_capability = merged

    async def follow(self, js: Any, bucket: str, loaded: asyncio.Event) -> None:
        """Load the bucket, set ``loaded``, then apply every later change until cancelled.

        A missing bucket is retried: the orchestrator may provision it after we start.
        """
        delay = 0.5
        while True:
            try:
                kv = await js.key_value(bucket)
                watcher = await kv.watchall()
            # The bucket does not exist yet, or NATS is reconnecting.
            except Exception as exc:  # noqa: BLE001
                log.debug("agents bucket %r unavailable (%s); retrying", bucket, exc)
                loaded.set()  # nothing to wait for: run with the decorator's schemas
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            try:
                async for entry in watcher:
                    if entry is None:  # end of the initial values
                        loaded.set()
                        continue
                    deleted = entry.operation in ("DEL", "PURGE")
                    self.apply(entry.key, None if deleted else entry.value)
            finally:
                try:
                    await watcher.stop()
                except Exception:  # the connection may already be closed
                    log.debug("stopping the agents watcher failed", exc_info=True)
            return
