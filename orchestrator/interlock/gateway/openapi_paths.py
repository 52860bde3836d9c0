"""The paths of the gateway's OpenAPI document (:mod:`interlock.gateway.openapi`), one
function per group of routes, in the order the document lists them."""

from __future__ import annotations

from typing import Any

from interlock.core.vocabulary import RECORDED
from interlock.gateway import queuepages as pages
from interlock.gateway import rest

REF = "#/components/schemas/{name}"
"""Where a schema named ``name`` is in the document."""


def all_paths() -> dict[str, Any]:
    """Every path of the REST API and its operations (without operation ids: the document
    derives them from the path); the events' and webhooks' are in
    :mod:`interlock.gateway.openapi_events`."""
    return {
        **_definition_paths(),
        **_run_paths(),
        **_run_log_paths(),
        **_run_debug_paths(),
        **_run_control_paths(),
        **_dead_letter_paths(),
        **_live_paths(),
    }


def ref(name: str) -> dict[str, Any]:
    """A reference to the schema ``name`` of the document's components."""
    return {"$ref": REF.format(name=name)}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_PROBLEM = {"$ref": "#/components/responses/Problem"}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): _PROBLEM for code in codes}


def _param(name: str, where: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": schema,
        "description": description,
    }


_RUN_ID = _param(
    "run_id", "path", {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"}, "A run id."
)
_LIMIT = _param(
    "limit",
    "query",
    {"type": "integer", "minimum": 1, "maximum": rest.MAX_LIMIT},
    f"How many (default {rest.DEFAULT_LIMIT}).",
)
_OFFSET = _param(
    "offset",
    "query",
    {"type": "integer", "minimum": 0, "maximum": 1 << 31},
    "Where the page starts (``next_offset`` of the page before).",
)
_INSTANT = {
    "anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "date"}]
}
"""An RFC 3339 time, or a date (its first instant, UTC)."""
_WORKFLOW_NAME = _param(
    "name",
    "path",
    {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
    "A workflow name.",
)
_NAMESPACE = _param(
    "namespace",
    "path",
    {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
    "A namespace.",
)
_SEQ = _param(
    "seq",
    "path",
    {"type": "integer", "minimum": 1, "maximum": rest.MAX_SEQ},
    "A dead letter's sequence.",
)
_VERSION = _param(
    "version",
    "query",
    {"type": "integer", "minimum": 1, "maximum": 1 << 31},
    "A stored version (default: the newest).",
)
_READ: list[dict[str, list[str]]] = [{"bearer": []}]


def _op(
    summary: str,
    responses: dict[str, Any],
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    tag: str,
    errors: tuple[int, ...] = (401, 403),
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "tags": [tag],
        "security": _READ,
        "responses": {**responses, **_errors(*errors)},
    }
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = body
    return op


def _definition_paths() -> dict[str, Any]:
    return {
        "/workflows": {
            "get": _op(
                "Workflows (newest version of each)",
                {"200": _json({"type": "array", "items": ref("WorkflowSummary")})},
                tag="workflows",
            )
        },
        "/workflows/{name}": {
            "get": _op(
                "One workflow: its versions and a version's manifest (default the newest)",
                {"200": _json(ref("WorkflowDetail"))},
                params=[_WORKFLOW_NAME, _VERSION],
                tag="workflows",
                errors=(400, 401, 403, 404),
            )
        },
        "/workflows/{namespace}/{name}": {
            "get": _op(
                "One workflow of a namespace",
                {"200": _json(ref("WorkflowDetail"))},
                params=[_NAMESPACE, _WORKFLOW_NAME, _VERSION],
                tag="workflows",
                errors=(400, 401, 403, 404),
            )
        },
        "/agents": {
            "get": _op(
                "AgentDefs and their live workers",
                {"200": _json({"type": "array", "items": ref("AgentView")})},
                tag="agents",
            )
        },
        "/queues": {
            "get": _op(
                "Limits per key: runs and requests at work and waiting, and what is paused",
                {"200": {**_json({"type": "array", "items": ref("QueueView")}), **pages.LINK}},
                params=[_param(n, "query", t, d) for n, t, d in _QUEUES_BY],
                tag="runs",
                errors=(400, 401, 403, 404),
            )
        },
    }


_TEXT = {"type": "string"}
_QUEUES_BY = (
    ("workflow", _TEXT, "Only the limits this workflow declares (NAME or NAMESPACE/NAME)."),
    ("capability", _TEXT, "Only this capability's limits, each of them (waited for or not)."),
    ("after", pages.AFTER, "Where the page starts: the token the last page's Link header gave."),
    ("limit", pages.LIMIT, "How many lines (default and most 500)."),
)


def _run_paths() -> dict[str, Any]:
    runs_list = _op(
        "Runs, newest first, with what each running one waits for "
        "(filter by workflow, status, start and what it waits for; paginated)",
        {"200": _json(ref("RunPage"))},
        params=[
            _param("workflow", "query", {"type": "string"}, "NAME or NAMESPACE/NAME."),
            _param("status", "query", {"enum": list(RECORDED)}, "Only this status."),
            _param(
                "since",
                "query",
                _INSTANT,
                "Only runs started at or after this RFC 3339 time (or date: its start, UTC).",
            ),
            _param(
                "until",
                "query",
                _INSTANT,
                "Only runs started before this RFC 3339 time (or date: its start, UTC).",
            ),
            _param(
                "waiting",
                "query",
                {"type": "string", "pattern": rest.WAITING.pattern},
                "Only running runs waiting for this: a kind (approval, event, agent, workflow, "
                "timer, slot) or a kind and a name (agent:review, event:fix.pushed).",
            ),
            _LIMIT,
            _OFFSET,
        ],
        tag="runs",
        errors=(400, 401, 403, 422),
    )
    start = _op(
        "Start a run of the newest version of a workflow (operator)",
        {"201": _json(ref("StartedResponse"), "Started")},
        body={"required": True, "content": {"application/json": {"schema": ref("StartRequest")}}},
        tag="runs",
        errors=(400, 401, 403, 404, 409, 413),
    )
    return {
        "/runs": {"get": runs_list, "post": start},
        "/runs/{run_id}": {
            "get": _op(
                "One run: status, state, pending actions, what it waits for, outputs, error",
                {"200": _json(ref("RunDescription"))},
                params=[_RUN_ID],
                tag="runs",
                errors=(400, 401, 403, 404),
            )
        },
        "/runs/{run_id}/result": {
            "get": _op(
                "How the run ended; with timeout, wait up to that long (long poll)",
                {"200": _json(ref("RunResult"))},
                params=[
                    _RUN_ID,
                    _param(
                        "timeout",
                        "query",
                        {"type": "number", "minimum": 0, "maximum": rest.MAX_WAIT_S},
                        "Seconds to wait for the end (status running when it has not).",
                    ),
                ],
                tag="runs",
                errors=(400, 401, 403, 404),
            )
        },
    }


def _run_log_paths() -> dict[str, Any]:
    return {
        "/runs/{run_id}/log": {
            "get": _op(
                "The run's log, a page of records in order",
                {"200": _json(ref("LogPage"))},
                params=[
                    _RUN_ID,
                    _param(
                        "limit",
                        "query",
                        {"type": "integer", "minimum": 1, "maximum": 5000},
                        "How many records (default 200).",
                    ),
                    _OFFSET,
                ],
                tag="runs",
                errors=(400, 401, 403, 404),
            )
        },
        "/runs/{run_id}/log/stream": {
            "get": {
                "summary": "The run's log live, as Server-Sent Events, until the run ends",
                "tags": ["runs"],
                "security": _READ,
                "parameters": [_RUN_ID, _OFFSET],
                "responses": {
                    "200": {
                        "description": "event: <record type>, id: <position>, data: the "
                        "record; a last event 'end'",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    **_errors(400, 401, 403, 404),
                },
            }
        },
    }


def _run_debug_paths() -> dict[str, Any]:
    return {
        "/runs/{run_id}/explain": {
            "get": _op(
                "Why the run went where it went, step by step (each guard weighed, with the "
                "values it read), and what would move it now (interlock explain --json)",
                {"200": _json({"type": "object"})},
                params=[
                    _RUN_ID,
                    _param(
                        "at",
                        "query",
                        {"type": "integer", "minimum": 1, "maximum": 1 << 31},
                        "Explain only the step holding this record (1-based).",
                    ),
                ],
                tag="runs",
                errors=(400, 401, 403, 404, 422),
            )
        },
        "/runs/{run_id}/replay": {
            "get": _op(
                "What another stored version would have done with the run's recorded "
                "inputs (interlock replay --json); nothing is written",
                {"200": _json({"type": "object"})},
                params=[
                    _RUN_ID,
                    {
                        **_param(
                            "against",
                            "query",
                            {"type": "integer", "minimum": 1, "maximum": 1 << 31},
                            "A stored version of the run's workflow.",
                        ),
                        "required": True,
                    },
                ],
                tag="runs",
                errors=(400, 401, 403, 404, 422),
            )
        },
    }


def _run_control_paths() -> dict[str, Any]:
    return {
        "/runs/{run_id}/cancel": {
            "post": _op(
                "Cancel a run (operator)",
                {"200": _json(ref("CancelResponse"))},
                params=[_RUN_ID],
                body={"content": {"application/json": {"schema": ref("CancelRequest")}}},
                tag="runs",
                errors=(400, 401, 403, 404),
            )
        },
        "/runs/{run_id}/signals/{name}": {
            "post": _op(
                "Send the event NAME to one run and say what it did (operator)",
                {"200": _json(ref("SignalResult"))},
                params=[
                    _RUN_ID,
                    _param("name", "path", {"type": "string"}, "The event type."),
                    _param(
                        "wait",
                        "query",
                        {"type": "number", "minimum": 0, "maximum": rest.MAX_WAIT_S},
                        "Seconds to wait for the run's decision (default 5).",
                    ),
                ],
                body={"content": {"application/json": {"schema": {}}}},
                tag="runs",
                errors=(400, 401, 403, 404),
            )
        },
    }


def _dead_letter_paths() -> dict[str, Any]:
    return {
        "/dead-letters": {
            "get": _op(
                "Dead letters kept, oldest first",
                {"200": _json({"type": "array", "items": ref("DeadLetterView")})},
                params=[_param("reason", "query", {"type": "string"}, "Only this reason.")],
                tag="dead letters",
            )
        },
        "/dead-letters/{seq}": {
            "get": _op(
                "One dead letter",
                {"200": _json(ref("DeadLetterView"))},
                params=[_SEQ],
                tag="dead letters",
                errors=(400, 401, 403, 404),
            )
        },
        "/dead-letters/{seq}/redrive": {
            "post": _op(
                "Publish a dead letter again where it came from, then drop it (operator)",
                {"200": _json(ref("RedriveResponse"))},
                params=[_SEQ],
                tag="dead letters",
                errors=(400, 401, 403, 404, 409),
            )
        },
    }


def _live_paths() -> dict[str, Any]:
    return {
        "/agents/failures": {
            "get": _op(
                "Failed attempts per capability in the last hour, read from the run logs "
                "(complete from since, when later), with the last failure of each",
                {"200": _json(ref("FailureReport"))},
                tag="agents",
                errors=(401, 403),
            )
        },
        "/live/runs": {
            "get": {
                "summary": "The run index's changes, as Server-Sent Events (never ends)",
                "tags": ["runs"],
                "security": _READ,
                "responses": {
                    "200": {
                        "description": "event: ready (following: list now), run (data: a "
                        "RunSummary written), gone (data: {run_id}), reset (changes were "
                        "missed: list again; the stream ends)",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    **_errors(401, 403),
                },
            }
        },
    }
