"""The OpenAPI paths of :mod:`interlock.gateway.acting`: fork, migrate, discard."""

from __future__ import annotations

from typing import Any

from interlock.gateway.openapi_paths import _RUN_ID, _SEQ, _json, _op, _param, ref


def acting_paths() -> dict[str, Any]:
    return {
        "/runs/{run_id}/fork": {
            "post": _op(
                "Fork a run at a record: a new run from its first records, going on live "
                "(dry_run: what the fork would be, nothing written) (operator)",
                {
                    "200": _json(ref("ForkReport"), "The dry run's preview"),
                    "201": _json(ref("ForkReport"), "Forked"),
                },
                params=[_RUN_ID],
                body={
                    "required": True,
                    "content": {"application/json": {"schema": ref("ForkRequest")}},
                },
                tag="runs",
                errors=(400, 401, 403, 404, 409),
            )
        },
        "/workflows/{namespace}/{name}/migrate": {
            "post": _op(
                "Move the workflow's running runs onto a version where their logs agree "
                "with it (dry_run: which would, nothing written) (operator)",
                {"200": _json(ref("MigrateReport"))},
                params=[
                    _param("namespace", "path", {"type": "string"}, "The namespace."),
                    _param("name", "path", {"type": "string"}, "The workflow's name."),
                ],
                body={
                    "required": True,
                    "content": {"application/json": {"schema": ref("MigrateRequest")}},
                },
                tag="workflows",
                errors=(400, 401, 403, 404),
            )
        },
    }


def pause_paths() -> dict[str, Any]:
    """``POST /workflows/{namespace}/{name}/pause|resume`` (with the namespace always: a
    path of three parts would be ``GET /workflows/{namespace}/{name}``'s), and ``POST
    /runs/{run_id}/pause|resume``."""
    out: dict[str, Any] = {}
    name = _param("name", "path", {"type": "string"}, "The workflow's name.")
    namespace = _param("namespace", "path", {"type": "string"}, "The namespace.")
    for verb, what in (
        ("pause", "Pause a workflow: its new runs wait (queued) until it is resumed"),
        ("resume", "Resume a workflow: the runs it held go on, in order"),
    ):
        body = {"content": {"application/json": {"schema": ref("PauseRequest")}}}
        out[f"/workflows/{{namespace}}/{{name}}/{verb}"] = {
            "post": _op(
                f"{what} (operator)",
                {"200": _json(ref("PauseResponse"))},
                params=[namespace, name],
                body=body if verb == "pause" else None,
                tag="workflows",
                errors=(400, 401, 403, 404) if verb == "pause" else (401, 403, 404),
            )
        }
    for verb, what in (
        (
            "pause",
            "Pause a run: it takes no transition and requests no action until resumed; the "
            "events that reach it meanwhile are held in its log",
        ),
        ("resume", "Resume a paused run: the events it held are decided on, in order"),
    ):
        body = {"content": {"application/json": {"schema": ref("RunPauseRequest")}}}
        out[f"/runs/{{run_id}}/{verb}"] = {
            "post": _op(
                f"{what} (operator)",
                {"200": _json(ref("RunPauseResponse"))},
                params=[_RUN_ID],
                body=body if verb == "pause" else None,
                tag="runs",
                errors=(400, 401, 403, 404),
            )
        }
    capability = _param("capability", "path", {"type": "string"}, "The capability's name.")
    for verb, what in (
        ("pause", "Pause a capability: nothing more of it is dispatched until it is resumed"),
        ("resume", "Resume a capability: the requests it held go on, in order"),
    ):
        body = {"content": {"application/json": {"schema": ref("CapabilityPauseRequest")}}}
        out[f"/capabilities/{{capability}}/{verb}"] = {
            "post": _op(
                f"{what} (operator)",
                {"200": _json(ref("CapabilityPauseResponse"))},
                params=[capability],
                body=body if verb == "pause" else None,
                tag="agents",
                errors=(400, 401, 403, 404) if verb == "pause" else (401, 403, 404),
            )
        }
    return out


def discard_many() -> dict[str, Any]:
    """``DELETE /dead-letters``, beside its ``GET``."""
    return _op(
        "Drop the dead letters of a reason and/or older than an age or a time (at least "
        "one) without publishing them (operator)",
        {"200": _json(ref("DiscardResponse"))},
        params=[
            _param("reason", "query", {"type": "string", "minLength": 1}, "Only this reason."),
            _param(
                "older_than",
                "query",
                {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ms|s|m|h|d))+$"},
                "Only those kept longer than this age (30s, 5m, 2h, 1d).",
            ),
            _param(
                "before",
                "query",
                {"type": "string", "format": "date-time"},
                "Only those kept before this RFC 3339 time (with older_than too: the earlier).",
            ),
        ],
        tag="dead letters",
        errors=(400, 401, 403),
    )


def discard_one() -> dict[str, Any]:
    """``DELETE /dead-letters/{seq}``, beside its ``GET``."""
    return _op(
        "Drop one dead letter without publishing it (operator)",
        {"200": _json(ref("DiscardResponse"))},
        params=[_SEQ],
        tag="dead letters",
        errors=(400, 401, 403, 404),
    )
