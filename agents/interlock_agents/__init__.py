"""Reference agents for Interlock: ``echo``, ``http-fetch`` and ``command``.

Each module defines a ``worker`` (an :class:`interlock.sdk.Worker`), and each agent's
AgentDef manifest lives in ``manifests/<name>.yaml``; the workers validate against the
schemas of their own manifest, so they behave the same whether or not it was applied.
Run one with ``interlock agent run echo``.
"""

from __future__ import annotations

from importlib import import_module, resources
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from interlock.sdk import Worker

__all__ = [
    "REFERENCE_AGENTS",
    "capability_schemas",
    "load_manifest",
    "load_worker",
    "manifest_text",
]

REFERENCE_AGENTS: dict[str, str] = {
    "echo": "interlock_agents.echo",
    "http-fetch": "interlock_agents.http_fetch",
    "command": "interlock_agents.command",
}
"""Agent name -> module defining its ``worker``."""


def _known() -> str:
    return ", ".join(sorted(REFERENCE_AGENTS))


def manifest_text(name: str) -> str:
    """The AgentDef manifest (YAML) of the reference agent ``name``."""
    if name not in REFERENCE_AGENTS:
        raise LookupError(f"no reference agent {name!r} (known: {_known()})")
    return resources.files(__name__).joinpath("manifests", f"{name}.yaml").read_text("utf-8")


def load_manifest(name: str) -> dict[str, Any]:
    """The parsed AgentDef manifest of the reference agent ``name``."""
    doc = yaml.safe_load(manifest_text(name))
    if not isinstance(doc, dict):
        # Bad content, not a bad call: callers catch ValueError.
        raise ValueError(f"the manifest of {name!r} is not a mapping")  # noqa: TRY004
    return doc


def capability_schemas(agent: str, capability: str) -> dict[str, Any]:
    """``input_schema`` and ``output_schema`` of one capability, as decorator arguments."""
    for cap in load_manifest(agent)["spec"]["capabilities"]:
        if cap["name"] == capability:
            return {
                "input_schema": cap.get("input_schema"),
                "output_schema": cap.get("output_schema"),
                "description": cap.get("description"),
            }
    raise LookupError(f"the AgentDef {agent!r} declares no capability {capability!r}")


def load_worker(name: str) -> Worker:
    """The ``worker`` of the reference agent ``name``."""
    if name not in REFERENCE_AGENTS:
        raise LookupError(f"no reference agent {name!r} (known: {_known()})")
    found: Worker = import_module(REFERENCE_AGENTS[name]).worker
    return found
