"""The REST API's calls that change runs and dead letters beyond start, cancel and signal:
fork a run, migrate a workflow's running runs (each with a dry run first, the preview), and
discard dead letters. Operators only; each is what the CLI does (``interlock fork``,
``interlock migrate``, ``interlock dead-letters discard``), through the same client."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from interlock.client import debugging
from interlock.core.pauses import MAX_REASON
from interlock.gateway.problems import Problem
from interlock.gateway.rest import RunId, _json_body, _name, _seq, json_view, operates

if TYPE_CHECKING:
    from interlock.gateway.service import Gateway

MAX_VERSION = 1 << 31
Positive = Annotated[int, msgspec.Meta(ge=1, le=MAX_VERSION)]


class ForkRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fork the run at record ``at`` (its first ``at`` records are copied), on ``version``
    (default: the version it ran), as ``run_id`` (default: a new id); ``dry_run``: say what
    the fork would be, write nothing."""

    at: Positive
    version: Positive | None = None
    run_id: RunId | None = None
    dry_run: bool = False


class MigrateRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Move the workflow's running runs onto version ``to`` where their logs agree with it;
    ``dry_run``: say which would move and why the others would not, write nothing."""

    to: Positive
    dry_run: bool = False


class RecordLine(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    type: str
    summary: str


class ForkOrigin(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    seq: int


class ForkReport(msgspec.Struct, frozen=True, kw_only=True):
    """A fork (``interlock fork --json``): the new run, where it came from, its version,
    the state it goes on in, its records after the origin's first ``seq``."""

    run_id: str
    origin: ForkOrigin
    version: int
    state: str
    records: list[RecordLine]
    dry_run: bool = False
    """Nothing was written: what the fork would be."""


class MigratedRun(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    run_id: str
    from_version: int | None = None
    state: str | None = None
    reason: str | None = None
    """Why it does not move (None: it moves, or would)."""
    seq: int | None = None
    """Where its ``run.migrated`` record is (or would be)."""
    divergence: dict[str, Any] | None = None
    """Where its log and the version disagree (``seq``, ``kind``, ``reason``)."""


class MigrateReport(msgspec.Struct, frozen=True, kw_only=True):
    """``interlock migrate --json``: the runs that moved (or would) and those that stay."""

    workflow: dict[str, str]
    to: dict[str, Any]
    dry_run: bool
    moved: list[MigratedRun]
    stayed: list[MigratedRun]


class DiscardResponse(msgspec.Struct, frozen=True, kw_only=True):
    discarded: list[int]
    """The sequences of the letters dropped, oldest first."""


@operates("fork runs")
async def fork_run(request: Request, gw: Gateway) -> Response:
    """``interlock fork RUN_ID --at SEQ [--workflow VERSION] [--run-id NEW] [--dry-run]
    --json``: the report, 201 when the fork was written."""
    from interlock.runtime.client import new_run_id

    req: ForkRequest = await _json_body(gw, request, ForkRequest, numbers=True)
    records = await gw.api.records(request.path_params["run_id"])
    new = req.run_id or new_run_id()
    report = await debugging.fork(
        gw.api.ops, records, req.at, req.version, new, dry_run=req.dry_run
    )
    return json_view(msgspec.convert(report, ForkReport), 200 if req.dry_run else 201)


@operates("migrate runs")
async def migrate_workflow(request: Request, gw: Gateway) -> Response:
    """``interlock migrate WORKFLOW --to VERSION [--dry-run] --json``: the report."""
    req: MigrateRequest = await _json_body(gw, request, MigrateRequest, numbers=True)
    name = _name(request)
    report = await gw.api.migrate(name, req.to, dry_run=req.dry_run)
    return json_view(msgspec.convert(report, MigrateReport))


@operates("discard dead letters")
async def discard_dead_letter(request: Request, gw: Gateway) -> Response:
    """``interlock dead-letters discard SEQ``."""
    letter = await gw.api.discard(_seq(request))
    return json_view(DiscardResponse(discarded=[letter.seq]))


@operates("discard dead letters")
async def discard_dead_letters(request: Request, gw: Gateway) -> Response:
    """``interlock dead-letters discard --reason R --older-than AGE``: the letters of
    ``reason`` and/or kept before ``before`` (RFC 3339) or longer than ``older_than``."""
    query = request.query_params
    reason = query.get("reason") or None
    before = _before(query.get("before"), query.get("older_than"))
    if reason is None and before is None:
        raise Problem(400, "bad-parameter", "name a reason, a time (before) or an age (older_than)")
    dropped = await gw.api.discard_dead_letters(reason=reason, before=before)
    return json_view(DiscardResponse(discarded=[d.seq for d in dropped]))


def _before(before: str | None, older_than: str | None) -> datetime | None:
    """The time letters must be kept before: ``before``, or ``older_than`` ago (both
    given: the earlier)."""
    from interlock.core.lowering_scope import parse_duration

    times = []
    if older_than is not None:
        seconds = parse_duration(older_than)
        if seconds is None:
            raise Problem(
                400,
                "bad-parameter",
                f"older_than {older_than!r}: an age such as 30s, 5m, 2h or 1d",
            )
        try:
            times.append(datetime.now(UTC) - timedelta(seconds=seconds))
        except OverflowError:
            times.append(datetime.min.replace(tzinfo=UTC))  # older than any letter
    if before is not None:
        try:
            at = datetime.fromisoformat(before.upper())
        except ValueError:
            raise Problem(400, "bad-parameter", f"before {before!r}: an RFC 3339 time") from None
        times.append(at if at.tzinfo else at.replace(tzinfo=UTC))
    return min(times) if times else None


Reason = Annotated[str, msgspec.Meta(max_length=MAX_REASON)]


class PauseRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Pause a workflow (an empty body is this with its defaults); ``runs``: its runs in
    flight are paused too, and resumed with it."""

    reason: Reason = "paused over HTTP"
    runs: bool = False


class PauseResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``interlock pause|resume workflow NAME --json``."""

    workflow: str
    paused: bool
    """Whether it is paused now."""
    changed: bool
    """Whether it was not so before."""
    runs: list[str] = []
    """The runs paused (or resumed) with it."""


class RunPauseRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason = "paused over HTTP"


class CapabilityPauseRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Pause a capability (an empty body is this with its default reason)."""

    reason: Reason = "paused over HTTP"


class RunPauseResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``interlock pause|resume run ID --json``."""

    run_id: str
    paused: bool
    """Whether it is paused now (as far as this call knows: False once it has ended)."""
    changed: bool
    """Whether this call paused (or resumed) it."""


@operates("pause workflows")
async def pause_workflow(request: Request, gw: Gateway) -> Response:
    """``interlock pause workflow NAME [--runs]``: its new runs wait until it is resumed."""
    from interlock.client.queues import pause_workflow as pause

    req: PauseRequest = await _json_body(gw, request, PauseRequest)
    name, runs, already = await pause(gw.api.ops, _name(request), req.reason, runs=req.runs)
    changed = already is None or bool(runs)  # (paused already: its runs paused now, if any)
    return json_view(PauseResponse(workflow=name, paused=True, changed=changed, runs=runs))


@operates("resume workflows")
async def resume_workflow(request: Request, gw: Gateway) -> Response:
    """``interlock resume workflow NAME``: the runs it held go on, in order."""
    from interlock.client.queues import resume_workflow as resume

    name, was, runs = await resume(gw.api.ops, _name(request))
    return json_view(PauseResponse(workflow=name, paused=False, changed=was, runs=runs))


@operates("pause runs")
async def pause_run(request: Request, gw: Gateway) -> Response:
    """``interlock pause run ID``: it takes no transition until resumed."""
    req: RunPauseRequest = await _json_body(gw, request, RunPauseRequest)
    run_id = request.path_params["run_id"]
    done = await gw.api.pause_run(run_id, req.reason)
    return json_view(RunPauseResponse(run_id=run_id, paused=done, changed=done))


@operates("resume runs")
async def resume_run(request: Request, gw: Gateway) -> Response:
    """``interlock resume run ID``: what it held is decided on, in order."""
    run_id = request.path_params["run_id"]
    done = await gw.api.resume_run(run_id)
    return json_view(RunPauseResponse(run_id=run_id, paused=False, changed=done))


class CapabilityPauseResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``interlock pause|resume capability NAME --json``."""

    capability: str
    paused: bool
    """Whether it is paused now."""
    changed: bool
    """Whether it was not so before."""


@operates("pause capabilities")
async def pause_capability(request: Request, gw: Gateway) -> Response:
    """``interlock pause capability NAME``: nothing more of it is dispatched (a
    capability paused already keeps its pause: ``changed`` false)."""
    from interlock.client.capqueues import pause_capability as pause

    req: CapabilityPauseRequest = await _json_body(gw, request, CapabilityPauseRequest)
    name = request.path_params["capability"]
    already = await pause(gw.api.ops, name, req.reason)
    return json_view(CapabilityPauseResponse(capability=name, paused=True, changed=already is None))


@operates("resume capabilities")
async def resume_capability(request: Request, gw: Gateway) -> Response:
    """``interlock resume capability NAME``: the requests it held go on, in order."""
    from interlock.client.capqueues import resume_capability as resume

    name = request.path_params["capability"]
    was = await resume(gw.api.ops, name)
    return json_view(CapabilityPauseResponse(capability=name, paused=False, changed=was))


ROUTES = [
    ("/workflows/{namespace}/{name}/pause", pause_workflow, ["POST"]),
    ("/workflows/{namespace}/{name}/resume", resume_workflow, ["POST"]),
    ("/runs/{run_id}/pause", pause_run, ["POST"]),
    ("/runs/{run_id}/resume", resume_run, ["POST"]),
    ("/capabilities/{capability}/pause", pause_capability, ["POST"]),
    ("/capabilities/{capability}/resume", resume_capability, ["POST"]),
    ("/runs/{run_id}/fork", fork_run, ["POST"]),
    ("/workflows/{namespace}/{name}/migrate", migrate_workflow, ["POST"]),
    ("/dead-letters/{seq}", discard_dead_letter, ["DELETE"]),
    ("/dead-letters", discard_dead_letters, ["DELETE"]),
]
"""(path, handler, methods) of these calls, for :func:`interlock.gateway.rest.routes`."""
