"""The gateway's ASGI application (Starlette) and the process that serves it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from interlock import views
from interlock.client import Client
from interlock.core.names import DNS_LABEL
from interlock.gateway import events as http_events
from interlock.gateway import webhooks
from interlock.gateway.auth import OPEN, Caller, Tokens
from interlock.gateway.problems import Problem, http_error_handler, problem_handler
from interlock.runtime.client import InterlockClient
from interlock.transport.cloudevents import CloudEvent, InvalidCloudEvent
from interlock.transport.health import health_routes, nats_readiness
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.gateway")

DEFAULT_MAX_BODY = 1 << 20
"""Largest request body taken by default (1 MiB, the default NATS max payload)."""


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        msgspec.json.encode(value),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


class Gateway:
    """What the routes share: the NATS connection, the registry, the token store.

    Args:
        nc: a connected NATS client (the gateway's own identity).
        subjects: the installation's names.
        open_mode: no credentials asked (every caller is an operator); the process serving
            it must listen on loopback only.
        max_body: the largest request body taken, in bytes (413 above it).
    """

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        *,
        open_mode: bool = False,
        max_body: int = DEFAULT_MAX_BODY,
        metrics: CollectorRegistry = REGISTRY,
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.api = Client(nc, subjects)
        """What the REST routes and /events go through: the same client as any program."""
        self.client = InterlockClient(nc, subjects)
        self.js = self.client.js
        self.registry = self.client.registry
        self.tokens = Tokens(self.js, subjects)
        self.deliveries = webhooks.Deliveries(self.js, subjects)
        self.open_mode = open_mode
        self.max_body = max_body
        self.metrics = metrics
        self.app = build_app(self)

    async def start(self) -> None:
        """Nothing to prepare yet: the client follows the registry on first use."""

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.api.close()
        with contextlib.suppress(Exception):
            await self.registry.close()

    async def emit(self, events: list[CloudEvent], wait: float) -> list[Any]:
        """Store each event (in order) with ``Client.emit``: what each starts."""
        return [views.to_builtins(await self.api.emit(e, wait=wait)) for e in events]

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

    async def reader(self, request: Request) -> Caller:
        who = await self.caller(request)
        if not who.may_read:
            raise Problem(403, "forbidden", f"role {who.role} may not read runs")
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


# -- routes ------------------------------------------------------------------------------


async def post_events(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    who = await gw.caller(request)
    if who.role not in ("operator", "publisher"):
        raise Problem(403, "forbidden", f"role {who.role} may not publish events")
    body = await gw.body(request)
    mode, events = http_events.parse_http(request.headers, body)
    refused = sorted({e.type for e in events if not who.may_publish(e.type)})
    if refused:
        raise Problem(
            403,
            "forbidden",
            f"{who.name} ({who.role}) may not publish {', '.join(refused)}",
            types=refused,
        )
    accepted = await gw.emit(events, _wait(request))
    return json_response({"mode": mode, "events": accepted}, 202)


def _wait(request: Request) -> float:
    """``?wait=SECONDS``: wait that long for the orchestrator to start the runs (default 0)."""
    from interlock.gateway.rest import _seconds_param

    return _seconds_param(request, "wait", 0.0)


async def post_webhook(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    params = request.path_params
    namespace = params.get("namespace", "default")
    name = params["name"]
    signal = None
    if "run_id" in params:
        signal = (params["run_id"], params["signal"])
    body = await gw.body(request)
    if not (DNS_LABEL.match(namespace) and DNS_LABEL.match(name)):
        raise Problem(404, "unknown-webhook", f"no webhook {namespace}/{name}: not a name")
    webhook = await gw.registry.webhook(namespace, name)
    if webhook is None:
        raise Problem(404, "unknown-webhook", f"no webhook {namespace}/{name} is applied")
    ref = webhook.spec.secret
    if signal is not None:
        if webhook.spec.signals is None:
            raise Problem(404, "no-signals", f"webhook {namespace}/{name} takes no signals")
        ref = webhook.spec.signals.secret or ref
    try:
        secret = webhooks.read_secret(ref)
    except webhooks.SecretUnavailable as exc:
        # The reason is the message: no traceback.
        log.error("webhook %s/%s: secret unavailable: %s", namespace, name, exc)  # noqa: TRY400
        raise Problem(
            503,
            "secret-unavailable",
            f"webhook {namespace}/{name} cannot check signatures here: its secret is not "
            "available to the gateway",
        ) from exc
    webhooks.verify(webhook, secret, body, request.headers)
    event = webhooks.to_event(webhook, request.headers, body, signal=signal)
    try:
        event = http_events.check(event)
    except InvalidCloudEvent as exc:
        raise Problem(400, "invalid-event", str(exc), reason=exc.reason) from exc
    first = await gw.deliveries.answer(webhook, event.id)
    if first is not None:
        return json_response(first, 202, headers={"Interlock-Replayed": "true"})
    accepted = await gw.emit([event], _wait(request))
    answer = {"webhook": f"{namespace}/{name}", "delivery": event.id, "events": accepted}
    answer = await gw.deliveries.remember(webhook, event.id, answer)
    return json_response(answer, 202)


async def nats_error_handler(request: Request, exc: Exception) -> Response:
    log.warning("%s %s: NATS: %s", request.method, request.url.path, exc)
    problem = Problem(
        503,
        "unavailable",
        f"NATS did not answer ({type(exc).__name__}); try again",
        headers={"Retry-After": "1"},
    )
    return problem.response(request.url.path)


def build_app(gw: Gateway) -> Starlette:
    from interlock.gateway import rest

    routes = [
        *health_routes(ready=nats_readiness(gw.nc, gw.subjects), registry=gw.metrics),
        Route("/events", post_events, methods=["POST"]),
        Route("/webhooks/{name}", post_webhook, methods=["POST"]),
        Route("/webhooks/{namespace}/{name}", post_webhook, methods=["POST"]),
        Route("/webhooks/{name}/runs/{run_id}/signals/{signal}", post_webhook, methods=["POST"]),
        *rest.routes(),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            Problem: problem_handler,
            HTTPException: http_error_handler,
            NatsError: nats_error_handler,
        },
    )
    app.state.gateway = gw
    return app


# -- the process -------------------------------------------------------------------------


async def serve_gateway(
    nc: NatsClient,
    subjects: Subjects,
    *,
    host: str,
    port: int,
    open_mode: bool = False,
    max_body: int = DEFAULT_MAX_BODY,
    stop: asyncio.Event,
    started: asyncio.Future[str] | None = None,
) -> None:
    """Serve the gateway on ``host:port`` until ``stop`` is set."""
    from interlock.transport.httpserver import HttpServer, is_loopback

    if open_mode and not is_loopback(host):
        raise ValueError(f"open mode listens on loopback only, not on {host}")
    gateway = Gateway(nc, subjects, open_mode=open_mode, max_body=max_body)
    await gateway.start()
    server = HttpServer(gateway.app, port, host=host)
    try:
        await server.start()
        log.info("HTTP gateway on %s%s", server.url, " (open: no credentials)" if open_mode else "")
        if started is not None and not started.done():
            started.set_result(server.url)
        await stop.wait()
    finally:
        await server.stop()
        await gateway.stop()
