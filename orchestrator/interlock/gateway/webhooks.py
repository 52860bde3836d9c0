"""Signed webhooks: ``POST /webhooks/<name>`` checked against a ``kind: Webhook`` and
turned into a CloudEvent.

Signature schemes:

- ``standard`` (the Standard Webhooks spec): ``webhook-id``, ``webhook-timestamp`` (Unix
  seconds) and ``webhook-signature`` (space-separated ``v1,<base64 HMAC-SHA256>`` of
  ``<id>.<timestamp>.<body>``), with a ``whsec_``-prefixed base64 secret. A timestamp
  further than the replay window from now is refused.
- ``github``: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`` with the secret
  as text (the header name can be changed with ``signature_header``, for senders such as
  Jira or Gitea that sign the same way); the delivery id is ``X-GitHub-Delivery``.

A request that fails the check gets 401 and nothing is stored. Only what is signed decides
anything:

- a delivery seen before (same webhook, within 7 days, the ``deliveries`` bucket) gets the
  answer the first one got, stored with it, and nothing is published again; "seen" is by
  what the scheme signs: the body's SHA-256 for ``github`` (its delivery header is not
  signed, so a new one makes no new delivery), the ``webhook-id`` for ``standard``;
- a type taken from a header (never signed) must be one of the manifest's ``values``;
- a signal names its run and signal in the signed body: the path must name the same.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from interlock.core.compiler import WebhookDefinition
from interlock.core.model import FromRequest, SecretRef, WebhookSignals
from interlock.core.rfc3339 import format_time
from interlock.core.vocabulary import InterlockError
from interlock.gateway.problems import Problem
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.cloudevents_model import InvalidCloudEvent, decode_json
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.runtime.client import InterlockClient

GITHUB_SIGNATURE = "X-Hub-Signature-256"
GITHUB_DELIVERY = "X-GitHub-Delivery"
STANDARD_ID = "webhook-id"
STANDARD_TIMESTAMP = "webhook-timestamp"
STANDARD_SIGNATURE = "webhook-signature"
_NOT_IN_TYPE = re.compile(r"[^A-Za-z0-9_.-]")


class SecretUnavailable(RuntimeError, InterlockError):
    """The gateway cannot read a webhook's secret (a deployment mistake, not the caller's)."""


def read_secret(ref: SecretRef) -> bytes:
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if not value:
            raise SecretUnavailable(f"environment variable {ref.env} is not set")
        return value.encode()
    assert ref.file is not None
    try:
        with open(ref.file, "rb") as f:
            value_bytes = f.read().strip()
    except OSError as exc:
        # A relative path is the gateway's, not the manifest's: say where it looked.
        where = (
            "" if os.path.isabs(ref.file) else f" (relative to the gateway's folder {os.getcwd()})"
        )
        raise SecretUnavailable(f"cannot read {ref.file}{where}: {exc.strerror or exc}") from exc
    if not value_bytes:
        raise SecretUnavailable(f"{ref.file} is empty")
    return value_bytes


def _unauthorized(detail: str) -> Problem:
    return Problem(401, "bad-signature", detail, title="Signature check failed")


def verify_github(secret: bytes, body: bytes, header_value: str | None, header: str) -> None:
    if not header_value:
        raise _unauthorized(f"missing {header} header")
    if not header_value.startswith("sha256="):
        raise _unauthorized(f"{header} must be sha256=<hex digest>")
    expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, header_value[len("sha256=") :].strip().lower()):
        raise _unauthorized(f"{header} does not match the body")


def standard_key(secret: bytes) -> bytes:
    text = secret.decode("utf-8", "replace").strip()
    if text.startswith("whsec_"):
        text = text[len("whsec_") :]
    try:
        return base64.b64decode(text + "==")
    except (binascii.Error, ValueError) as exc:
        raise SecretUnavailable("a Standard Webhooks secret is whsec_<base64>") from exc


def verify_standard(
    secret: bytes, body: bytes, headers: Mapping[str, str], window_s: float, now: float
) -> None:
    msg_id = headers.get(STANDARD_ID)
    stamp = headers.get(STANDARD_TIMESTAMP)
    signatures = headers.get(STANDARD_SIGNATURE)
    missing = [
        n
        for n, v in (
            (STANDARD_ID, msg_id),
            (STANDARD_TIMESTAMP, stamp),
            (STANDARD_SIGNATURE, signatures),
        )
        if not v
    ]
    if missing:
        raise _unauthorized("missing header " + ", ".join(missing))
    assert msg_id
    assert stamp
    assert signatures
    try:
        timestamp = int(stamp)
    except ValueError:
        raise _unauthorized(f"{STANDARD_TIMESTAMP} is not a Unix time in seconds") from None
    if abs(now - timestamp) > window_s:
        raise Problem(
            401,
            "stale-timestamp",
            f"{STANDARD_TIMESTAMP} {timestamp} is {int(abs(now - timestamp))} s from now; "
            f"the replay window is {int(window_s)} s",
            title="Timestamp outside the replay window",
        )
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    for item in signatures.split():
        version, _, encoded = item.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, given):
            return
    raise _unauthorized(f"no v1 signature in {STANDARD_SIGNATURE} matches")


def verify(
    webhook: WebhookDefinition,
    secret: bytes,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
) -> None:
    """Raise a 401 Problem unless the request is signed with ``secret`` and fresh."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if webhook.spec.scheme == "github":
        header = webhook.spec.signature_header or GITHUB_SIGNATURE
        verify_github(secret, body, lowered.get(header.lower()), header)
    else:
        verify_standard(
            secret, body, lowered, webhook.replay_window_s, time.time() if now is None else now
        )


def replay_key(webhook: WebhookDefinition, body: bytes, headers: Mapping[str, str]) -> str:
    """What makes two requests the same delivery: only what the scheme signs."""
    if webhook.spec.scheme == "github":
        return "sha256:" + hashlib.sha256(body).hexdigest()
    lowered = {k.lower(): v for k, v in headers.items()}
    return "id:" + lowered.get(STANDARD_ID, "")


def delivery_id(webhook: WebhookDefinition, headers: Mapping[str, str], data: Any) -> str:
    lowered = {k.lower(): v for k, v in headers.items()}
    if webhook.spec.id is not None:
        value = take(webhook.spec.id, lowered, data, "id")
    else:
        header = GITHUB_DELIVERY if webhook.spec.scheme == "github" else STANDARD_ID
        found = lowered.get(header.lower())
        if not found:
            raise Problem(400, "missing-delivery-id", f"missing {header} header (the delivery id)")
        value = found
    return value


def take(ref: FromRequest, lowered: Mapping[str, str], data: Any, what: str) -> str:
    """The value ``ref`` names, with its prefix; a 400 Problem when it is not there."""
    if ref.value is not None:
        value: Any = ref.value
    elif ref.header is not None:
        value = lowered.get(ref.header.lower())
        if not value:
            raise Problem(400, "unmappable-request", f"{what}: missing header {ref.header}")
        if ref.values is not None and value not in ref.values:
            raise Problem(
                400,
                "unlisted-value",
                f"{what}: header {ref.header} says {value[:100]!r}, not one of the values "
                f"this webhook takes ({', '.join(ref.values)})",
            )
    else:
        assert ref.field is not None
        value = data
        for key in ref.field.split("."):
            if not isinstance(value, dict) or key not in value:
                raise Problem(
                    400, "unmappable-request", f"{what}: the JSON body has no field {ref.field}"
                )
            value = value[key]
        if isinstance(value, dict | list) or value is None:
            raise Problem(
                400, "unmappable-request", f"{what}: field {ref.field} is not a string or number"
            )
    return ref.prefix + str(value)


def parse_body(body: bytes, content_type: str | None) -> tuple[Any, str | None]:
    """The body as the event's data, and its ``datacontenttype``."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in ("", "application/json") or media.endswith("+json"):
        try:
            return _json(body) if body else None, "application/json"
        except msgspec.DecodeError:
            if media:
                raise Problem(400, "invalid-body", "the body is declared JSON but is not") from None
    if media == "application/x-www-form-urlencoded":
        # GitHub's form content type: the JSON is in the "payload" field.
        from urllib.parse import parse_qs

        payload = parse_qs(body.decode("utf-8", "replace")).get("payload")
        if payload:
            try:
                return _json(payload[0].encode()), "application/json"
            except msgspec.DecodeError:
                pass
    try:
        return body.decode("utf-8"), content_type or "text/plain"
    except UnicodeDecodeError:
        return body, content_type or "application/octet-stream"


def _json(body: bytes) -> Any:
    """JSON within the events' nesting bound (400 beyond it: it would be dead-lettered)."""
    try:
        return decode_json(body, "the body")
    except InvalidCloudEvent as exc:
        raise Problem(400, "invalid-body", str(exc), reason=exc.reason) from exc


def to_event(
    webhook: WebhookDefinition,
    headers: Mapping[str, str],
    body: bytes,
    *,
    signal: tuple[str, str] | None = None,
) -> CloudEvent:
    """The CloudEvent a verified request stands for (``signal``: (run id, signal name))."""
    lowered = {k.lower(): v for k, v in headers.items()}
    data, content_type = parse_body(body, lowered.get("content-type"))
    extensions: dict[str, str] = {}
    if signal is not None:
        assert webhook.spec.signals is not None
        run_id, name = signal
        signed_target(webhook.spec.signals, data, run_id, name)
        event_type = webhook.spec.signals.prefix + name
        extensions["runid"] = run_id
    else:
        event_type = take(webhook.spec.type, lowered, data, "type")
    event_type = _NOT_IN_TYPE.sub("_", event_type).strip(".")
    subject = None
    if webhook.spec.subject is not None and signal is None:
        # Optional: a request without it (GitHub's ping, say) is still an event.
        with contextlib.suppress(Problem):
            subject = take(webhook.spec.subject, lowered, data, "subject")
    return CloudEvent(
        id=delivery_id(webhook, lowered, data),
        source=webhook.source,
        type=event_type,
        subject=subject,
        time=format_time(datetime.now(UTC), "auto"),
        datacontenttype=content_type,
        data=data,
        extensions=extensions,
    )


def signed_target(signals: WebhookSignals, data: Any, run_id: str, name: str) -> None:
    """Refuse a signal whose signed body does not name the run and signal of its path (the
    path is not signed: a signal for one run posted to another's path would move that one)."""
    for field, given, what in (
        (signals.run_field, run_id, "run"),
        (signals.signal_field, name, "signal"),
    ):
        value: Any = data
        for key in field.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value != given:
            said = "names none" if value is None else f"names {str(value)[:100]!r}"
            raise Problem(
                401,
                "unsigned-target",
                f"the signed body {said} at {field}, not the {what} {given!r} of the path: "
                f"a signal names its {what} in the body it signs",
                title="The signature does not cover this target",
            )


async def check_signal_run(ops: InterlockClient, webhook: WebhookDefinition, run_id: str) -> None:
    """Refuse a signal to a run that is not of the webhook's own namespace (403
    ``other-namespace``), or to no run at all (404 ``unknown-run``). A webhook's secret is
    held by one team's sender (its CI, its ticket system), and a signal names the run it
    moves and the event type it sends: without this, that sender moved any team's run
    whose id it knew, at the step it waits in."""
    from interlock.client.errors import UnknownRun, no_stream_is_no_run

    try:
        async with no_stream_is_no_run(run_id):
            state = (await ops.read_state(run_id)).state
    except UnknownRun:
        raise Problem(404, "unknown-run", f"no run {run_id!r}") from None
    if state.namespace != webhook.namespace:
        raise Problem(
            403,
            "other-namespace",
            f"run {run_id!r} is of namespace {state.namespace!r}: webhook "
            f"{webhook.namespace}/{webhook.name} signals the runs of its own namespace only",
        )


class Deliveries:
    """Deliveries already answered, with their answers (the ``deliveries`` bucket)."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._kv: KeyValue | None = None

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(self._subjects.deliveries_bucket)
        return self._kv

    @staticmethod
    def key(webhook: WebhookDefinition, delivery: str) -> str:
        digest = hashlib.sha256(delivery.encode()).hexdigest()[:40]
        return f"{webhook.namespace}.{webhook.name}.{digest}"

    async def answer(self, webhook: WebhookDefinition, delivery: str) -> dict[str, Any] | None:
        """The answer given to this delivery before, if any."""
        kv = await self.kv()
        try:
            entry = await kv.get(self.key(webhook, delivery))
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        stored: dict[str, Any] = json.loads(entry.value)
        return stored

    async def remember(
        self, webhook: WebhookDefinition, delivery: str, answer: dict[str, Any]
    ) -> dict[str, Any]:
        """Keep ``answer`` for this delivery; if another request got there first, its answer."""
        kv = await self.kv()
        try:
            await kv.create(self.key(webhook, delivery), json.dumps(answer).encode())
        except KeyWrongLastSequenceError:
            first = await self.answer(webhook, delivery)
            return first if first is not None else answer
        return answer
