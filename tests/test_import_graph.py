"""The layers import only downwards, and no two modules import each other.

Read from the source (every ``import``, including those inside functions and under
``TYPE_CHECKING``: a cycle hidden behind a late import is still a cycle of the design):

- core      imports nothing of Interlock's outside the core;
- dialects  import the core at most (a dialect lowers a manifest into core structures);
- transport imports the core at most, and ``auth.jwt`` (see ``ALLOWED``); it also holds
            what the runtime and the SDK share and the SDK may not take from the runtime
            (``transport.observing``: the observers' fan-out both use);
- auth      imports the core and the transport;
- views     import the core and the transport;
- runtime   imports the core, the transport, the views and the dialects, never the SDK,
            the client, the gateway or the reference agents;
- sdk       imports the transport (and the core), never the runtime;
- client    imports the runtime and everything under it, never the SDK, the gateway or
            the CLI;
- gateway   imports the client and everything under it, never the SDK or the CLI;
- cli       may import everything (``interlock dev`` wires the runtime and the SDK);
- and no cycle between modules anywhere.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "orchestrator", ROOT / "agents")

FORBIDDEN = {
    "interlock.core": ("interlock.",),
    "interlock.dialects": (
        "interlock.transport",
        "interlock.auth",
        "interlock.views",
        "interlock.runtime",
        "interlock.sdk",
        "interlock.client",
        "interlock.gateway",
        "interlock.cli",
        "interlock_agents",
    ),
    "interlock.transport": (
        "interlock.auth",
        "interlock.views",
        "interlock.dialects",
        "interlock.runtime",
        "interlock.sdk",
        "interlock.client",
        "interlock.gateway",
        "interlock.cli",
        "interlock_agents",
    ),
    "interlock.auth": (
        "interlock.views",
        "interlock.dialects",
        "interlock.runtime",
        "interlock.sdk",
        "interlock.client",
        "interlock.gateway",
        "interlock.cli",
        "interlock_agents",
    ),
    "interlock.auth.jwt": ("interlock.",),
    "interlock.views": (
        "interlock.auth",
        "interlock.dialects",
        "interlock.runtime",
        "interlock.sdk",
        "interlock.client",
        "interlock.gateway",
        "interlock.cli",
        "interlock_agents",
    ),
    "interlock.runtime": (
        "interlock.sdk",
        "interlock.client",
        "interlock.gateway",
        "interlock.cli",
        "interlock_agents",
    ),
    "interlock.sdk": ("interlock.runtime", "interlock.cli", "interlock.gateway"),
    "interlock.client": (
        "interlock.sdk",
        "interlock.gateway",
        "interlock.cli",
        "interlock_agents",
    ),
    "interlock.gateway": ("interlock.sdk", "interlock.cli", "interlock_agents"),
}
"""Package -> the packages its modules may not import (the core may import itself)."""

ALLOWED = {
    # The transport's connect() reads the user name and tags of a creds file to name the
    # connection and refuse a wrong role early. auth.jwt is a leaf (only ``nkeys``, pinned by
    # its own rule above): moving it under transport would split the NATS credential code
    # that the rest of auth builds on, for no change in what depends on what.
    "interlock.transport": ("interlock.auth.jwt",),
}
"""Package -> modules it may import although ``FORBIDDEN`` bans their package."""


def _under(target: str, prefix: str) -> bool:
    """Whether ``target`` is the module or package ``prefix`` or inside it
    (``interlock.cli`` does not cover ``interlock.client``)."""
    if prefix.endswith("."):
        return target.startswith(prefix)
    return target == prefix or target.startswith(prefix + ".")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for base in SOURCES:
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[str]:
    """The Interlock modules ``name`` imports (``from pkg import submodule`` names the
    submodule; ``from pkg import thing`` names the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in MODULES else base)
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


GRAPH = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read() -> None:
    assert "interlock.transport.tasks" in MODULES
    assert "interlock.transport.tasks" in GRAPH["interlock.sdk.taking"]
    assert "interlock.runtime.service" in GRAPH["interlock.cli.process_cmds"]
    assert "interlock.auth.jwt" in GRAPH["interlock.transport.connection"]
    assert "interlock.transport.observing" in GRAPH["interlock.runtime.observe"]
    assert "interlock.transport.observing" in GRAPH["interlock.sdk.observe"]


def test_no_module_cycle() -> None:
    assert _cycles() == []


def test_layers_import_only_downwards() -> None:
    wrong = []
    for name, targets in sorted(GRAPH.items()):
        for package, banned in FORBIDDEN.items():
            if name != package and not name.startswith(package + "."):
                continue
            for target in sorted(targets):
                if package == "interlock.core" and target.startswith("interlock.core"):
                    continue
                if any(_under(target, a) for a in ALLOWED.get(package, ())):
                    continue
                if any(_under(target, b) for b in banned):
                    wrong.append(f"{name} -> {target}")
    assert wrong == []
