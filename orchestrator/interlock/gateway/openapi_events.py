"""The events' and the webhooks' paths of the gateway's OpenAPI document
(:mod:`interlock.gateway.openapi`): what takes events from outside."""

from __future__ import annotations

from typing import Any

from interlock.gateway import rest
from interlock.gateway.openapi_paths import _NAMESPACE, _READ, _RUN_ID, _errors, _json, _param, ref

_WEBHOOK = _param(
    "name",
    "path",
    {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
    "A webhook's name (its kind: Webhook's metadata.name).",
)
_SIGNAL = _param(
    "signal",
    "path",
    {"type": "string", "minLength": 1, "maxLength": 200},
    "The signal: appended to the webhook's signals.prefix, it is the event type sent.",
)
_WAIT = _param(
    "wait",
    "query",
    {"type": "number", "minimum": 0, "maximum": rest.MAX_WAIT_S},
    "Seconds to wait for the orchestrator to start the runs each event starts (default 0: "
    "answer once stored; those not started in time are `pending`).",
)


def event_paths() -> dict[str, Any]:
    """``POST /events`` and the webhooks' routes, each with its ``?wait=``."""
    return {
        "/events": {
            "post": {
                "summary": "CloudEvents over HTTP: binary, structured or batched mode",
                "tags": ["events"],
                "security": _READ,
                "parameters": [
                    _param("ce-specversion", "header", {"type": "string"}, "Binary mode."),
                    _param("ce-id", "header", {"type": "string"}, "Binary mode."),
                    _param("ce-source", "header", {"type": "string"}, "Binary mode."),
                    _param("ce-type", "header", {"type": "string"}, "Binary mode."),
                    _WAIT,
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/cloudevents+json": {"schema": ref("CloudEvent")},
                        "application/cloudevents-batch+json": {
                            "schema": {"type": "array", "items": ref("CloudEvent")}
                        },
                        "application/json": {"schema": {}},
                    },
                },
                "responses": {
                    "202": _json(ref("Accepted"), "Stored; the runs each event starts"),
                    # 503: NATS did not answer; 507: the uploads bucket is full.
                    **_errors(400, 401, 403, 413, 415, 503, 507),
                },
            }
        },
        "/webhooks/{name}": {
            "post": _webhook(
                "A signed webhook (a kind: Webhook says how it is checked)", [_WEBHOOK]
            )
        },
        "/webhooks/{namespace}/{name}": {
            "post": _webhook("A signed webhook of a namespace", [_NAMESPACE, _WEBHOOK])
        },
        "/webhooks/{name}/runs/{run_id}/signals/{signal}": {
            "post": _webhook(
                "A signal to one run of the webhook's namespace (else 403), signed as its "
                "deliveries (`signals`): type `prefix` + `signal`; the signed body names both",
                [_WEBHOOK, _RUN_ID, _SIGNAL],
            )
        },
        "/webhooks/{namespace}/{name}/runs/{run_id}/signals/{signal}": {
            "post": _webhook(
                "A signal to one run of the webhook's namespace (else 403), for a webhook of "
                "another namespace than default; signed and checked as the default's",
                [_NAMESPACE, _WEBHOOK, _RUN_ID, _SIGNAL],
            )
        },
    }


def _webhook(summary: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "summary": summary,
        "tags": ["events"],
        "security": [],
        "parameters": [*params, _WAIT],
        "requestBody": {"content": {"application/json": {"schema": {}}}},
        "responses": {
            "202": _json(ref("Accepted"), "Stored, or a delivery seen before"),
            **_errors(400, 401, 403, 404, 413, 503, 507),
        },
    }
