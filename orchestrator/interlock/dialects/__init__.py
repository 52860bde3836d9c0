"""The seed systems' own workflow files, loaded as written and lowered to the native
manifest language, so that every format compiles to the one Definition IR.

``prepare`` takes files as the CLI reads them, finds each document's format (from the
document itself, or the ``dialect`` the caller names), checks it with that format's own
rules (rule ids ``<dialect>.<rule>``, positions in the original file, JSON included), and
returns native documents that keep those positions. Files in the native format pass
through untouched. Pure: no I/O beyond what it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from interlock.core.diagnostics import Diagnostic
from interlock.core.source import MERGE_REFUSED, Document, load_documents
from interlock.dialects import ctxmesh, kxm, kxm_runtime, synapse, synapse_lower, workfile
from interlock.dialects.base import Lowered, Note
from interlock.dialects.jsonpos import load_json, looks_like_json

DIALECTS = ("ctxmesh", "workfile", "synapse", "kxm")
"""Every format ``--dialect`` names (``native`` is the manifest language itself)."""

Lower = Callable[[Document, list[Diagnostic]], Lowered | None]


def _registry() -> dict[str, tuple[Callable[[Any], bool], Lower]]:
    return {
        "ctxmesh": (ctxmesh.detect, ctxmesh.lower),
        "workfile": (workfile.detect, workfile.lower),
        "synapse": (synapse.detect, synapse_lower.lower),
        "kxm": (_kxm_detect, _kxm_lower),
    }


def _kxm_detect(data: Any) -> bool:
    return kxm.detect(data) or kxm_runtime.detect(data)


def _kxm_lower(doc: Document, diags: list[Diagnostic]) -> Lowered | None:
    """Both kxm forms: the webhook definitions (a JSON array) and a Runtime workflow."""
    if isinstance(doc.data, dict):
        return kxm_runtime.lower(doc, diags)
    return kxm.lower(doc, diags)


@dataclass(slots=True)
class Prepared:
    """Files ready for the native compiler."""

    sources: list[tuple[str, str]] = field(default_factory=list)
    """Native files, untouched."""
    documents: list[Document] = field(default_factory=list)
    """Native documents lowered from a dialect (or native documents of a mixed file)."""
    agents: list[Document] = field(default_factory=list)
    """The AgentDefs the dialect documents imply."""
    diagnostics: list[Diagnostic] = field(default_factory=list)
    lowered: list[Lowered] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diagnostics

    @property
    def warnings(self) -> list[Diagnostic]:
        """What the files say that is kept but not acted on: printed, not refused."""
        return sorted(w for item in self.lowered for w in item.warnings)

    def notes(self, doc: Document) -> list[Note]:
        for item in self.lowered:
            if id(doc) in item.notes:
                return item.notes[id(doc)]
        return []


def declares_any(agent: Document, capabilities: Iterable[str]) -> bool:
    """Whether an (implied) AgentDef declares one of ``capabilities``."""
    known = set(capabilities)
    spec = agent.data.get("spec") if isinstance(agent.data, dict) else None
    caps = spec.get("capabilities") if isinstance(spec, dict) else None
    return any(isinstance(c, dict) and c.get("name") in known for c in caps or [])


def detect(data: Any) -> str | None:
    """The dialect of a document's data, or None (native, or not recognised)."""
    for name, (test, _) in _registry().items():
        if test(data):
            return name
    return None


def prepare(sources: Iterable[tuple[str, str]], dialect: str | None = None) -> Prepared:
    """Detect, check and lower every dialect document of ``sources`` (``dialect``: force
    one format for every file; ``native`` passes everything through)."""
    out = Prepared()
    registry = _registry()
    for path, text in sources:
        if dialect == "native":
            out.sources.append((path, text))
            continue
        documents, errors, is_json = load(text, path, dialect)
        documents = [item for doc in documents for item in list_items(doc)]
        kinds = [dialect or detect(d.data) for d in documents]
        if not any(kinds) and not (is_json and errors):
            out.sources.append((path, text))
            continue
        out.diagnostics.extend(errors)
        for doc, kind in zip(documents, kinds, strict=True):
            if not kind:
                # A native document beside a dialect's: the native language has no merges.
                out.diagnostics.extend(
                    Diagnostic(path, at.line, at.col, "unsupported", MERGE_REFUSED)
                    for at in doc.merges
                )
                out.documents.append(doc)
                continue
            if kind not in registry:
                out.diagnostics.append(
                    Diagnostic(path, 1, 1, "dialect", f"unknown dialect {kind!r}")
                )
                continue
            _, lower = registry[kind]
            if dialect and not isinstance(doc.data, dict | list):
                # Named with --dialect: its own rules say what is wrong, once it has a shape.
                out.diagnostics.append(
                    doc.diag((), "dialect", f"this document is not a {kind} workflow file")
                )
                continue
            try:
                lowered = lower(doc, out.diagnostics)
            except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
                # A shape no rule foresaw: refuse the document clearly rather than crash.
                out.diagnostics.append(
                    doc.diag((), f"{kind}.unreadable", f"cannot read this {kind} file: {exc}")
                )
                continue
            if lowered is None:
                continue
            out.lowered.append(lowered)
            out.documents.extend(lowered.workflows)
            out.agents.extend(lowered.agents)
    workfile.check_calls(out.lowered, out.diagnostics)
    out.diagnostics.sort()
    return out


def list_items(doc: Document) -> list[Document]:
    """A Kubernetes ``List`` (``apiVersion: v1``, what ``kubectl get -o yaml`` writes for
    several resources, and ``kubectl apply`` takes) as its items, each a document of its
    own with its positions in the file, when one of them is a dialect's; else ``doc``."""
    data = doc.data
    if not (
        isinstance(data, dict)
        and data.get("apiVersion") == "v1"
        and data.get("kind") == "List"
        and isinstance(data.get("items"), list)
        and any(detect(item) for item in data["items"])
    ):
        return [doc]
    out = []
    for i, item in enumerate(data["items"]):
        prefix = ("items", i)
        out.append(
            Document(
                path=doc.path,
                index=doc.index,
                data=item,
                values={p[2:]: span for p, span in doc.values.items() if p[:2] == prefix},
                keys={p[2:]: span for p, span in doc.keys.items() if p[:2] == prefix},
                start=doc.values.get(prefix, doc.start),
                text=doc.text,
            )
        )
    return out


def load(
    text: str, path: str, dialect: str | None
) -> tuple[list[Document], list[Diagnostic], bool]:
    """Documents of a file: JSON when it looks like JSON (positions kept), else YAML."""
    if looks_like_json(text):
        doc, errors = load_json(text, path)
        if doc is not None:
            return [doc], errors, True
        # Not JSON: a YAML flow mapping, perhaps. Report the JSON error only when the file
        # is one of the JSON formats.
        documents, yaml_errors = load_documents(text, path, merge=True)
        if yaml_errors or dialect or any(detect(d.data) for d in documents):
            return [], errors, True
        return documents, yaml_errors, False
    documents, errors = load_documents(text, path, merge=True)
    return documents, errors, False
