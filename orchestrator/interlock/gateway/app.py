"""The gateway's ASGI application (Starlette) and the process that serves it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from interlock.console import ConsoleConfig
from interlock.core.diagnostics import ManifestError
from interlock.core.names import DNS_LABEL
from interlock.gateway import events as http_events
from interlock.gateway import webhooks
from interlock.gateway.metrics import RequestMetrics
from interlock.gateway.problems import (
    Problem,
    error_table_handler,
    http_error_handler,
    problem_handler,
)
from interlock.gateway.service import DEFAULT_MAX_BODY, Gateway
from interlock.transport.cloudevents import InvalidCloudEvent
from interlock.transport.health import health_routes, nats_readiness
from interlock.transport.logmac import LogKeyUnavailable, SecretDamaged
from interlock.transport.objects import ObjectLimits
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.gateway")


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        msgspec.json.encode(value),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


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
    if not who.may_operate and any("runid" in e.extensions for e in events):
        # As on NATS: a publisher's events reach runs by triggers and correlation only.
        raise Problem(
            403,
            "forbidden",
            f"{who.name} ({who.role}) may not address a run (extension runid); operators may",
        )
    # A publisher reads nothing: told what its NATS credential is told (stored, no more).
    accepted = await gw.emit(events, _wait(request), publisher=not who.may_read)
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
    try:
        webhook = await gw.registry.webhook(namespace, name)
    except ManifestError as exc:
        # Applied before a rule it now breaks (a type from a header without 'values').
        log.error("webhook %s/%s: %s", namespace, name, exc)  # noqa: TRY400
        raise Problem(
            503,
            "webhook-outdated",
            f"webhook {namespace}/{name} breaks a rule of this version; apply it again: "
            + "; ".join(f"{d.rule}: {d.message}" for d in exc.diagnostics),
        ) from exc
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
    if signal is not None:
        await webhooks.check_signal_run(gw.client, webhook, signal[0])
    seen = webhooks.replay_key(webhook, body, request.headers)
    first = await gw.deliveries.answer(webhook, seen)
    if first is not None:
        return json_response(first, 202, headers={"Interlock-Replayed": "true"})
    accepted = await gw.emit([event], _wait(request))
    answer = {"webhook": f"{namespace}/{name}", "delivery": event.id, "events": accepted}
    answer = await gw.deliveries.remember(webhook, seen, answer)
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


async def openapi(request: Request) -> Response:
    from interlock.gateway.openapi import document

    return json_response(document())


DEFAULT_CONSOLE = ConsoleConfig()


def build_app(gw: Gateway, console: ConsoleConfig | None = DEFAULT_CONSOLE) -> Starlette:
    """The gateway's routes; with ``console``, the web console at ``/ui/`` too."""
    from interlock import console as web_console
    from interlock.gateway import acting, rest

    routes = [
        *health_routes(ready=nats_readiness(gw.nc, gw.subjects), registry=gw.metrics),
        Route("/events", post_events, methods=["POST"]),
        Route("/webhooks/{name}", post_webhook, methods=["POST"]),
        Route("/webhooks/{namespace}/{name}", post_webhook, methods=["POST"]),
        Route("/webhooks/{name}/runs/{run_id}/signals/{signal}", post_webhook, methods=["POST"]),
        Route(
            "/webhooks/{namespace}/{name}/runs/{run_id}/signals/{signal}",
            post_webhook,
            methods=["POST"],
        ),
        Route("/openapi.json", openapi, methods=["GET"]),
        *rest.routes(acting.ROUTES),
    ]
    if console is not None:
        routes += web_console.routes(console)
    app = Starlette(
        routes=routes,
        middleware=[Middleware(RequestMetrics, routes=routes, registry=gw.metrics)],
        exception_handlers={
            Problem: problem_handler,
            HTTPException: http_error_handler,
            NatsError: nats_error_handler,
            SecretDamaged: error_table_handler,
            LogKeyUnavailable: error_table_handler,
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
    console: ConsoleConfig | None = DEFAULT_CONSOLE,
    stop: asyncio.Event,
    started: asyncio.Future[str] | None = None,
    objects: ObjectLimits | None = None,
) -> None:
    """Serve the gateway on ``host:port`` until ``stop`` is set (with the web console at
    ``/ui/`` unless ``console`` is None)."""
    from interlock.transport.httpserver import HttpServer, is_loopback

    if open_mode and not is_loopback(host):
        raise ValueError(f"open mode listens on loopback only, not on {host}")
    gateway = Gateway(nc, subjects, open_mode=open_mode, max_body=max_body, objects=objects)
    await gateway.start()
    server = HttpServer(build_app(gateway, console), port, host=host)
    try:
        await server.start()
        log.info("HTTP gateway on %s%s", server.url, " (open: no credentials)" if open_mode else "")
        if started is not None and not started.done():
            started.set_result(server.url)
        await stop.wait()
    finally:
        await server.stop()
        await gateway.stop()
