"""Manifest files in, compiled definitions or positioned diagnostics out.

Validation is static and complete before anything runs, in three passes: structure
(:mod:`interlock.core.structure`, against the JSON Schemas generated from
:mod:`interlock.core.model`), lowering each workflow to its definition
(:mod:`interlock.core.lowering`), and the rules over the whole workflow
(:mod:`interlock.core.rules`). Every problem of every document is reported, each with the
file, line and column, and the rule it breaks (the rule ids are listed in
docs/language.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from interlock.core import model
from interlock.core.definition import AgentDefinition, CapabilityDef, Definition
from interlock.core.diagnostics import Diagnostic, ManifestError
from interlock.core.ids import capability_token, token_taken
from interlock.core.lowering import lower_workflow
from interlock.core.lowering_capacity import lower_capacity
from interlock.core.lowering_scope import parse_duration
from interlock.core.names import CAPABILITY_NAME, check_metadata
from interlock.core.source import Document, Path, load_documents
from interlock.core.structure import check_structure

MAX_REPLAY_WINDOW_S = 7 * 86400.0
"""The longest ``replay_window`` of a Webhook (how long its deliveries are remembered)."""


@dataclass(frozen=True, slots=True)
class WebhookDefinition:
    """A compiled ``kind: Webhook``: how a signed HTTP request becomes a CloudEvent."""

    namespace: str
    name: str
    spec: model.WebhookSpec
    replay_window_s: float
    manifest: dict[str, Any]

    @property
    def source(self) -> str:
        """The CloudEvent source of its events."""
        return self.spec.source or f"interlock://webhooks/{self.namespace}/{self.name}"


@dataclass(slots=True)
class Compiled:
    """What a set of manifest files compiled to."""

    workflows: list[Definition] = field(default_factory=list)
    agents: list[AgentDefinition] = field(default_factory=list)
    webhooks: list[WebhookDefinition] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    capabilities_checked: bool = True

    @property
    def ok(self) -> bool:
        return not self.diagnostics

    def raise_for_errors(self) -> None:
        if self.diagnostics:
            raise ManifestError(self.diagnostics)


def compile_sources(
    sources: Iterable[tuple[str, str]],
    *,
    agent_sources: Iterable[tuple[str, str]] = (),
    known_capabilities: Collection[str] | None = None,
    documents: Iterable[Document] = (),
) -> Compiled:
    """Compile manifest texts given as (path, text), and ``documents`` already loaded (the
    native documents a dialect lowered, which keep their original file's positions).

    Capabilities are checked against the AgentDefs found in ``sources`` and
    ``agent_sources`` plus ``known_capabilities`` (for example a registry's). When none of
    those names any capability, the check is skipped and ``capabilities_checked`` is False.
    """
    out = Compiled()
    workflow_docs: list[Document] = []
    loaded: list[Document] = list(documents)
    for path, text in [*sources, *agent_sources]:
        docs, errors = load_documents(text, path)
        out.diagnostics.extend(errors)
        loaded.extend(docs)
    agent_docs: list[Document] = []
    for doc in loaded:
        kind = check_structure(doc, out.diagnostics)
        if kind == "Workflow":
            workflow_docs.append(doc)
        elif kind == "AgentDef":
            agent = _compile_agent(doc, _kept(doc, out.diagnostics))
            if agent is not None:
                out.agents.append(agent)
                agent_docs.append(doc)
        elif kind == "Webhook":
            webhook = _compile_webhook(doc, out.diagnostics)
            if webhook is not None:
                out.webhooks.append(webhook)
    capabilities = set(known_capabilities or ())
    _check_tokens(agent_docs, out.agents, capabilities, out.diagnostics)
    for agent in out.agents:
        capabilities.update(agent.capabilities)
    out.capabilities_checked = bool(capabilities)
    outputs = {
        name: cap.output_schema
        for agent in out.agents
        for name, cap in agent.capabilities.items()
        if cap.output_schema
    }
    seen: dict[tuple[str, str], Document] = {}
    for doc in workflow_docs:
        definition = lower_workflow(
            doc,
            _kept(doc, out.diagnostics),
            capabilities if out.capabilities_checked else None,
            outputs,
        )
        if definition is None:
            continue
        key = (definition.namespace, definition.name)
        if key in seen:
            out.diagnostics.append(
                doc.diag(
                    ("metadata", "name"),
                    "duplicate-name",
                    f"workflow {definition.name!r} is also defined in {seen[key].path}",
                )
            )
            continue
        seen[key] = doc
        out.workflows.append(definition)
    out.diagnostics.sort()
    if out.diagnostics:
        out.workflows.clear()
        out.webhooks.clear()
    return out


class _Expressions(list[Diagnostic]):
    """Where a partial document's rules report: only its expressions' errors are kept."""

    def __init__(self, into: list[Diagnostic]) -> None:
        super().__init__()
        self._into = into

    def append(self, diagnostic: Diagnostic) -> None:
        super().append(diagnostic)
        if diagnostic.rule.startswith("cel-"):
            self._into.append(diagnostic)

    def extend(self, diagnostics: Iterable[Diagnostic]) -> None:
        for diagnostic in diagnostics:
            self.append(diagnostic)


def _kept(doc: Document, diags: list[Diagnostic]) -> list[Diagnostic]:
    """Where the rules of ``doc`` report: ``diags``, or, for a document the schema left
    partial, a list that passes on its expressions' errors alone (``cel-compile``,
    ``cel-cost``): the other rules would read what was left out as errors of their own."""
    return _Expressions(diags) if doc.partial else diags


def compile_workflow_text(text: str, path: str = "<manifest>") -> Definition:
    """Compile exactly one workflow (capabilities unchecked); raises ManifestError."""
    compiled = compile_sources([(path, text)])
    compiled.raise_for_errors()
    if len(compiled.workflows) != 1:
        raise ManifestError(
            [Diagnostic(path, 1, 1, "wrong-kind", "expected exactly one Workflow document")]
        )
    return compiled.workflows[0]


def compile_workflow_data(data: Mapping[str, Any], path: str = "<stored>") -> Definition:
    """Rebuild a definition from a stored (already validated) manifest document (no
    source text: the JSON it is compiled from is not what was written)."""
    return replace(compile_workflow_text(json.dumps(data), path), source="")


def compile_agent_data(data: Mapping[str, Any], path: str = "<stored>") -> AgentDefinition:
    """Rebuild an AgentDef from a stored manifest document."""
    compiled = compile_sources([(path, json.dumps(data))])
    compiled.raise_for_errors()
    return compiled.agents[0]


def _check_tokens(
    docs: list[Document],
    agents: list[AgentDefinition],
    known: Collection[str],
    diags: list[Diagnostic],
) -> None:
    """Two capabilities whose names make the same subject token (``a.b`` and ``a_b``)
    would share a task consumer, heartbeat keys and the permissions on them: an agent of
    one could take the other's tasks. Refused where the second is named."""
    owners: dict[str, str] = {}
    for name in sorted(known):
        token_taken(owners, name)
    for doc, agent in zip(docs, agents, strict=True):
        for i, name in enumerate(agent.capabilities):
            other = token_taken(owners, name)
            if other is not None:
                token = capability_token(name)
                diags.append(
                    doc.diag(
                        ("spec", "capabilities", i, "name"),
                        "capability-clash",
                        f"capabilities {name!r} and {other!r} make the same NATS name "
                        f"({token}): they would share a task queue, and an agent of one "
                        "could take the other's tasks; rename one",
                    )
                )


def _compile_agent(doc: Document, diags: list[Diagnostic]) -> AgentDefinition | None:
    spec = msgspec.convert(doc.data, model.AgentDef)
    before = len(diags)
    check_metadata(doc, spec.metadata, diags)
    capabilities: dict[str, CapabilityDef] = {}
    for i, cap in enumerate(spec.spec.capabilities):
        path: Path = ("spec", "capabilities", i, "name")
        if not CAPABILITY_NAME.match(cap.name):
            diags.append(
                doc.diag(
                    path,
                    "bad-name",
                    f"capability name {cap.name!r} must be dot-separated words "
                    "of letters, digits, '_' or '-' (it becomes a NATS subject)",
                )
            )
        if cap.name in capabilities:
            diags.append(doc.diag(path, "duplicate-name", f"capability {cap.name!r} twice"))
        for which in ("input_schema", "output_schema"):
            schema = getattr(cap, which)
            if schema is None:
                continue
            import jsonschema

            try:
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except jsonschema.SchemaError as exc:
                diags.append(
                    doc.diag(
                        ("spec", "capabilities", i, which),
                        "bad-schema",
                        f"{which} is not a valid JSON Schema: {exc.message}",
                    )
                )
        capabilities[cap.name] = CapabilityDef(
            name=cap.name,
            input_schema=cap.input_schema,
            output_schema=cap.output_schema,
            timeout_s=cap.timeout_seconds,
            max_retries=cap.max_retries,
            description=cap.description,
            limits=lower_capacity(doc, diags, i, cap),
        )
    if len(diags) != before:
        return None
    return AgentDefinition(
        name=spec.metadata.name,
        namespace=spec.metadata.namespace,
        api_version=spec.apiVersion,
        capabilities=capabilities,
        manifest=doc.data,
    )


# --- webhooks -------------------------------------------------------------------------

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def compile_webhook_data(data: Mapping[str, Any], path: str = "<stored>") -> WebhookDefinition:
    """A stored Webhook manifest (already validated when applied) as its definition."""
    diags: list[Diagnostic] = []
    doc = Document(path=path, index=0, data=dict(data))
    webhook = _compile_webhook(doc, diags)
    if webhook is None:
        raise ManifestError(diags)
    return webhook


def _compile_webhook(doc: Document, diags: list[Diagnostic]) -> WebhookDefinition | None:
    webhook = msgspec.convert(doc.data, model.Webhook)
    spec = webhook.spec
    before = len(diags)
    check_metadata(doc, webhook.metadata, diags)

    def one_secret(ref: model.SecretRef, at: Path) -> None:
        if (ref.env is None) == (ref.file is None):
            diags.append(
                doc.diag(
                    at,
                    "bad-secret",
                    "a secret names exactly one of 'env' (an environment variable) or "
                    "'file' (a path); it is never written in the manifest",
                )
            )

    def one_source(ref: model.FromRequest | None, at: Path) -> None:
        if ref is None:
            return
        given = [k for k in ("header", "field", "value") if getattr(ref, k) is not None]
        if len(given) != 1:
            diags.append(
                doc.diag(
                    at,
                    "bad-mapping",
                    "name exactly one of 'header', 'field' (a dotted path into the JSON "
                    f"body) or 'value', not {' and '.join(given) or 'none'}",
                )
            )
        if ref.header is not None and not _HEADER_NAME.match(ref.header):
            diags.append(doc.diag((*at, "header"), "bad-name", f"{ref.header!r} is no header"))

    one_secret(spec.secret, ("spec", "secret"))
    if spec.signals is not None and spec.signals.secret is not None:
        one_secret(spec.signals.secret, ("spec", "signals", "secret"))
    one_source(spec.type, ("spec", "type"))
    one_source(spec.id, ("spec", "id"))
    one_source(spec.subject, ("spec", "subject"))
    _check_unsigned(doc, spec, diags)
    if spec.signature_header is not None and not _HEADER_NAME.match(spec.signature_header):
        diags.append(doc.diag(("spec", "signature_header"), "bad-name", "not an HTTP header name"))
    window = parse_duration(spec.replay_window)
    if window is None or window <= 0 or window > MAX_REPLAY_WINDOW_S:
        diags.append(
            doc.diag(
                ("spec", "replay_window"),
                "bad-duration",
                f"replay_window {spec.replay_window!r} must be a duration from 1s to 7d",
            )
        )
    if len(diags) != before:
        return None
    return WebhookDefinition(
        namespace=webhook.metadata.namespace,
        name=webhook.metadata.name,
        spec=spec,
        replay_window_s=float(window or 0),
        manifest=dict(doc.data),
    )


def _check_unsigned(doc: Document, spec: model.WebhookSpec, diags: list[Diagnostic]) -> None:
    """A type from a header (which no scheme signs) lists the values it may take."""
    given = spec.type
    if (
        given.header is not None
        and given.field is None
        and given.value is None
        and not given.values
    ):
        # Neither scheme signs a header other than its own: a header alone would let
        # whoever holds one signed delivery resend it as any event type.
        diags.append(
            doc.diag(
                ("spec", "type"),
                "unsigned-type",
                f"header {given.header} is not covered by the signature: list the "
                "values it may take ('values'), take the type from a field of the signed "
                "body ('field') or fix it ('value')",
            )
        )
    for what, ref in (("type", spec.type), ("id", spec.id), ("subject", spec.subject)):
        if ref is not None and ref.values is not None and (ref.header is None or what != "type"):
            diags.append(
                doc.diag(
                    ("spec", what, "values"),
                    "bad-mapping",
                    "'values' lists what a header may say, and only for 'type'",
                )
            )
