"""nats-py's private attributes are read in the transport only.

nats-py has no public accessor for some of what Interlock needs (a JetStream context's
connection, its API prefix and timeout, a bucket's subject prefix); ``transport.jetstream``
and ``transport.kvread`` read them, in one place each. Every other module of Interlock and
of the reference agents goes through those helpers: this walks their source for an
attribute of another object (not ``self``) named as one of nats-py's own private ones.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

import nats

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "orchestrator" / "interlock", ROOT / "agents")
TRANSPORT = ROOT / "orchestrator" / "interlock" / "transport"


@functools.cache
def _nats_private_names() -> frozenset[str]:
    """The private attributes nats-py's classes set on themselves (``self._x = ...``)."""
    names: set[str] = set()
    for path in Path(nats.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                names.add(node.attr)
    return frozenset(names)


def _ours() -> Iterable[Path]:
    """Interlock's and the reference agents' modules, the transport's left out."""
    for base in SOURCES:
        for path in sorted(base.rglob("*.py")):
            if TRANSPORT not in path.parents:
                yield path


def _reads(paths: Iterable[Path]) -> list[str]:
    """Where ``paths`` read one of nats-py's private attributes of another object."""
    names = _nats_private_names()
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in names
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and not isinstance(node.value, ast.Call)  # super()._x
            ):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_nats_private_attributes_are_read_in_the_transport_only() -> None:
    assert {"_nc", "_prefix", "_timeout"} <= _nats_private_names()  # the walk reads nats-py
    assert _reads(_ours()) == []


def test_the_walk_finds_a_private_read(tmp_path: Path) -> None:
    """The check itself: a read such as the gateway's run list once made is found, one of
    the module's own attributes is not."""
    module = tmp_path / "runlist.py"
    module.write_text(
        "class RunList:\n"
        "    def __init__(self, js, subjects):\n"
        "        self._nc = js._nc\n"
        "        self._pages = RunPages(self._nc, subjects)\n"
    )
    assert _reads([module]) == ["runlist.py:3: js._nc"]
