"""The OpenAPI 3.1 document of the gateway, served at ``/openapi.json``.

Response and request schemas are generated from the msgspec types the handlers encode
(``interlock.views`` and the request types of :mod:`interlock.gateway.rest`), so the
document describes what is sent, not what was meant to be; the paths are built in
:mod:`interlock.gateway.openapi_paths`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from interlock import __version__, views
from interlock.gateway import acting, failures, rest
from interlock.gateway.openapi_acting import (
    acting_paths,
    discard_many,
    discard_one,
    pause_paths,
)
from interlock.gateway.openapi_events import event_paths
from interlock.gateway.openapi_paths import REF, all_paths, ref
from interlock.views.queueshape import QueueView

_TYPES: list[Any] = [
    views.WorkflowSummary,
    views.WorkflowDetail,
    views.AgentView,
    views.RunDescription,
    views.RunResult,
    views.SignalResult,
    views.EmitResult,
    views.DeadLetterView,
    QueueView,
    rest.RunPage,
    rest.LogPage,
    rest.StartRequest,
    rest.StartedResponse,
    rest.CancelRequest,
    rest.CancelResponse,
    rest.RedriveResponse,
    acting.ForkRequest,
    acting.ForkReport,
    acting.MigrateRequest,
    acting.MigrateReport,
    acting.DiscardResponse,
    acting.PauseRequest,
    acting.PauseResponse,
    acting.RunPauseRequest,
    acting.RunPauseResponse,
    acting.CapabilityPauseRequest,
    acting.CapabilityPauseResponse,
    failures.FailureReport,
]

_CLOUDEVENT = {
    "type": "object",
    "required": ["specversion", "id", "source", "type"],
    "properties": {
        "specversion": {"const": "1.0"},
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "type": {"type": "string", "minLength": 1},
        # null is the same as absent (the JSON event format)
        "subject": {"type": ["string", "null"]},
        "time": {"type": ["string", "null"], "format": "date-time"},
        "datacontenttype": {"type": ["string", "null"]},
        "dataschema": {"type": ["string", "null"]},
        "data": {},
        "data_base64": {"type": ["string", "null"]},
    },
    # Extension attributes; null is the same as absent (JSON event format).
    "additionalProperties": {"type": ["string", "integer", "boolean", "null"]},
}

_ACCEPTED = {
    "type": "object",
    "required": ["events"],
    "properties": {
        "mode": {"enum": ["binary", "structured", "batched"]},
        "webhook": {"type": "string"},
        "delivery": {"type": "string"},
        "events": {"type": "array", "items": ref("EmitResult")},
    },
}


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}").replace("-", "_") for w in path.strip("/").split("/")]
    return "_".join([method, *words]).replace(".", "_")


@cache
def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway, from the types its routes answer with."""
    paths = {**event_paths(), **all_paths(), **acting_paths(), **pause_paths()}
    paths["/dead-letters/{seq}"]["delete"] = discard_one()
    paths["/dead-letters"]["delete"] = discard_many()
    components = _components()
    for path, ops in paths.items():
        for method, op in ops.items():
            op["operationId"] = _operation_id(method, path)
    run_links = {
        name: {
            "operationId": _operation_id(method, path),
            "parameters": {"run_id": "$response.body#/run_id"},
        }
        for name, method, path in (
            ("GetRun", "get", "/runs/{run_id}"),
            ("GetResult", "get", "/runs/{run_id}/result"),
            ("GetLog", "get", "/runs/{run_id}/log"),
            ("Cancel", "post", "/runs/{run_id}/cancel"),
            ("Explain", "get", "/runs/{run_id}/explain"),
        )
    }
    paths["/runs"]["post"]["responses"]["201"]["links"] = run_links
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Interlock HTTP gateway",
            "version": __version__,
            "description": "CloudEvents over HTTP, signed webhooks, and runs over REST. "
            "See docs/http.md.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": {
                "Problem": {
                    "description": "An RFC 9457 problem",
                    "content": {"application/problem+json": {"schema": ref("Problem")}},
                }
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _components() -> dict[str, Any]:
    (_, components) = msgspec.json.schema_components(_TYPES, ref_template=REF)
    components["Problem"] = {
        "type": "object",
        "description": "An RFC 9457 problem.",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "instance": {"type": "string"},
        },
    }
    components["CloudEvent"] = _CLOUDEVENT
    components["Accepted"] = _ACCEPTED
    return components
