"""What the gateway's routes share: its NATS connection, the client, tokens, deliveries."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from nats.aio.client import Client as NatsClient
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.requests import Request

from interlock import views
from interlock.client import Client
from interlock.core.ids import check_run_id
from interlock.core.objects import is_marker
from interlock.gateway import webhooks
from interlock.gateway.auth import OPEN, STREAM_MAX_AGE_S, Caller, Tokens
from interlock.gateway.failures import Failures
from interlock.gateway.problems import Problem
from interlock.gateway.runlist import RunList
from interlock.gateway.runlogs import RunLogs
from interlock.transport.cloudevents import CloudEvent, encode_binary
from interlock.transport.objects import BucketFull, ObjectLimits
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.gateway")

DEFAULT_MAX_BODY = 16 << 20
"""Largest request body taken by default (16 MiB: an event's data over the object
threshold is stored by reference, up to the object bound)."""


class Gateway:
    """What the routes share: the NATS connection, the registry, the token store.

    Args:
        nc: a connected NATS client (the gateway's own identity).
        subjects: the installation's names.
        open_mode: no credentials asked (every caller is an operator); the process serving
            it must listen on loopback only.
        max_body: the largest request body taken, in bytes (413 above it).
        objects: from which size an event's data or a run's inputs are stored by
            reference, and the largest stored (default: INTERLOCK_OBJECT_*, else 256 KiB
            and 64 MiB).
    """

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        *,
        open_mode: bool = False,
        max_body: int = DEFAULT_MAX_BODY,
        metrics: CollectorRegistry = REGISTRY,
        objects: ObjectLimits | None = None,
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.api = Client(nc, subjects)
        if objects is not None:
            self.api.ops.use_objects(objects)
        """What the REST routes and /events go through: the same client as any program."""
        self.client = self.api.ops
        """The operations underneath ``api`` (one registry and one run-log watcher)."""
        self.client.lines.enabled = False  # its account may not write the slots bucket
        self.js = self.client.js
        self.registry = self.client.registry
        self.tokens = Tokens(self.js, subjects)
        self.run_list = RunList(self.js, subjects)
        """The run index in memory, for ``GET /runs``."""
        self.run_logs = RunLogs(self.api.ops)
        """The logs read recently, for a run's description, log pages and explanation."""
        self.failures = Failures(nc, subjects, self.run_logs)
        """Failed attempts per capability, for ``GET /agents/failures``."""
        self.deliveries = webhooks.Deliveries(self.js, subjects)
        self.open_mode = open_mode
        self.max_body = max_body
        self.metrics = metrics

    async def start(self) -> None:
        """Start counting failed attempts (the client follows the registry on first use)."""
        await self.failures.start()

    async def stop(self) -> None:
        await self.run_list.stop()
        await self.failures.stop()
        with contextlib.suppress(Exception):
            await self.api.close()  # its registry too

    async def emit(
        self, events: list[CloudEvent], wait: float, *, publisher: bool = False
    ) -> list[Any]:
        """Store each event (in order) as ``Client.emit`` does, and say what each starts:
        a batch's events are published together (``emitting.emit_batch``). A
        ``publisher`` is told what its own NATS credential would be: that each is stored."""
        from interlock.client import InvalidRunId
        from interlock.client.emitting import check_size, emit_batch
        from interlock.runtime.errors import EventTooLarge

        # Every event checked before the first is stored: a batch goes whole or not at all.
        for index, event in enumerate(events):
            where = f"event {index} of the batch: " if len(events) > 1 else ""
            if is_marker(event.data):
                # The gateway stores what is over the threshold itself: a reference sent
                # in would have it name an object of the caller's choosing.
                raise Problem(
                    400,
                    "invalid-reference",
                    f"{where}the event's data is a reference to a stored object ($object): "
                    "send the data whole",
                    index=index,
                )
            run_id = event.extensions.get("runid")
            if run_id is not None:
                try:
                    check_run_id(run_id)
                except InvalidRunId as exc:
                    raise Problem(400, "invalid-event", f"{where}extension runid: {exc}") from exc
            try:  # data over the threshold goes by reference (client.emitting.by_reference)
                limit = self.client.payloads.objects.max_bytes
                check_size(encode_binary(event)[1], self.nc.max_payload, limit)
            except EventTooLarge as exc:
                raise Problem(
                    413, "event-too-large", where + str(exc), max_bytes=exc.limit, index=index
                ) from exc
        try:
            answers = await emit_batch(self.client, events, wait, publisher=publisher)
            return [views.to_builtins(r) for r in answers]
        except BucketFull as exc:
            # The uploads bucket holds what its operator bounded it to (max_bytes).
            raise Problem(507, "uploads-full", str(exc)) from exc

    # -- access ---------------------------------------------------------------------------

    async def caller(self, request: Request) -> Caller:
        """Who is calling (401 without a known bearer token)."""
        if self.open_mode:
            return OPEN
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem(
                401,
                "unauthenticated",
                "send Authorization: Bearer <token> (interlock tokens create NAME --role ROLE)",
                headers={"WWW-Authenticate": 'Bearer realm="interlock"'},
            )
        found = await self.tokens.caller(token.strip())
        if found is None:
            raise Problem(
                401,
                "unauthenticated",
                "the bearer token is not known (revoked or never issued)",
                headers={"WWW-Authenticate": 'Bearer realm="interlock", error="invalid_token"'},
            )
        return found

    async def still_reads(self, request: Request) -> bool:
        """Whether the caller of an open stream may still read (its token not revoked)."""
        if self.open_mode:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        found = await self.tokens.caller(token.strip(), max_age=STREAM_MAX_AGE_S)
        return found is not None and found.may_read

    async def reader(self, request: Request) -> Caller:
        who = await self.caller(request)
        if not who.may_read:
            if who.role == "publisher":
                # Said in full: a publisher's token signed into the console lands here.
                raise Problem(
                    403,
                    "forbidden",
                    "role publisher may not read runs: a publisher's token may only send "
                    f"events (POST /events) of the types {', '.join(who.events)}; reading "
                    "takes a reader's or an operator's token",
                    role=who.role,
                )
            raise Problem(403, "forbidden", f"role {who.role} may not read runs", role=who.role)
        return who

    async def operator(self, request: Request, what: str) -> Caller:
        who = await self.caller(request)
        if not who.may_operate:
            raise Problem(403, "forbidden", f"role {who.role} may not {what}; operators may")
        return who

    async def body(self, request: Request) -> bytes:
        """The request body, refused with 413 beyond ``max_body``."""
        declared = request.headers.get("content-length")
        too_large = Problem(
            413,
            "too-large",
            f"the body is larger than {self.max_body} bytes",
            max_bytes=self.max_body,
        )
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)
