"""The names the manifest language accepts: DNS labels for workflows and namespaces,
dot-separated words for capabilities and event types (they become NATS subjects)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interlock.core import model
    from interlock.core.diagnostics import Diagnostic
    from interlock.core.source import Document

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
STATE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
WORKFLOW_REF = re.compile(
    r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
)
BUCKET_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A JetStream Object Store bucket's name (``archive.bucket``)."""
CAPABILITY_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
EVENT_TYPE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def check_metadata(doc: Document, meta: model.Metadata, diags: list[Diagnostic]) -> None:
    """A workflow's or an AgentDef's name and namespace are DNS labels."""
    for key in ("name", "namespace"):
        value = getattr(meta, key)
        if not DNS_LABEL.match(value):
            diags.append(
                doc.diag(
                    ("metadata", key),
                    "bad-name",
                    f"metadata.{key} {value!r} is not a DNS label "
                    "(lowercase letters, digits and '-', 1-63 characters, "
                    "starting and ending with a letter or digit)",
                )
            )
