"""The REST API over workflows, runs, agents and dead letters.

Every answer is a view of :mod:`interlock.views`, the shapes ``interlock.Client`` returns
and ``interlock ... --output json`` prints, got through the same ``Client``: the CLI, a
program and HTTP never disagree.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from interlock import views
from interlock.client import debugging, reading
from interlock.core.bounds import MAX_DEPTH
from interlock.core.deadline import MAX_DEADLINE_S
from interlock.core.names import DNS_LABEL
from interlock.core.objects import is_marker
from interlock.core.vocabulary import RECORDED, InterlockError, RunStatus
from interlock.gateway.problems import Problem, as_problem, int_param
from interlock.gateway.queuepages import queue_listing
from interlock.transport.cloudevents_model import InvalidCloudEvent, decode_json
from interlock.views.shapes import WAITING_KINDS

if TYPE_CHECKING:
    from interlock.gateway.service import Gateway

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_WAIT_S = 300.0
MAX_SEQ = (1 << 63) - 1
KINDS = WAITING_KINDS
"""What ``GET /runs?waiting=`` filters by."""
WAITING = re.compile(rf"^({'|'.join(KINDS)})(:[^\x00-\x20\x7f]+)?$")


class RunPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of runs, newest first; ``next_offset`` is null on the last page."""

    runs: list[views.RunSummary]
    next_offset: int | None = None


class LogPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of a run's log (records as CloudEvent JSON objects), in order."""

    records: list[dict[str, Any]]
    next_offset: int | None = None
    finished: bool = False


WorkflowRef = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="NAME or NAMESPACE/NAME",
    ),
]
RunId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]


class StartRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start a run of the newest version of ``workflow`` (``name`` or ``namespace/name``)."""

    workflow: WorkflowRef
    inputs: dict[str, Any] = {}
    run_id: RunId | None = None
    deadline: (
        Annotated[
            float,
            msgspec.Meta(
                ge=0,
                le=MAX_DEADLINE_S,
                description="Seconds the run may take, over the workflow's spec.deadline; "
                "then it ends as that says (its goto, else failed with timeout). 0: at once, "
                "before anything is asked for.",
            ),
        ]
        | None
    ) = None


class StartedResponse(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    workflow: str


class CancelRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: str = "cancelled by user"


class CancelResponse(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    cancelled: bool
    """False when the run had finished already."""


class RedriveResponse(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    """The dead letter's sequence (gone now)."""
    stored: int
    """The sequence of the message published again."""


def json_view(value: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status_code=status, media_type="application/json")


# -- reading the request -----------------------------------------------------------------


def _seconds_param(request: Request, name: str, default: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise Problem(400, "bad-parameter", f"{name} must be a number of seconds") from None
    if not 0 <= value <= MAX_WAIT_S:
        raise Problem(400, "bad-parameter", f"{name} must be from 0 to {MAX_WAIT_S:g} seconds")
    return value


def _time_param(request: Request, name: str) -> datetime | None:
    """An RFC 3339 time (``2026-12-01T09:30:00Z``; without an offset: UTC; to the minute
    or to the second) or a date alone (its first instant, UTC)."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        raise Problem(
            400, "bad-parameter", f"{name} must be an RFC 3339 time or a date, got {raw!r}"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _started_between(started_at: str, since: datetime | None, until: datetime | None) -> bool:
    try:
        at = datetime.fromisoformat(started_at)
    except ValueError:
        return False
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (since is None or at >= since) and (until is None or at < until)


async def _json_body(
    gw: Gateway, request: Request, kind: type[Any], *, numbers: bool = False
) -> Any:
    """The body as ``kind``; ``numbers``: a whole number written as a float (``3.0``, an
    integer to JSON Schema) is taken, as msgspec's lax mode does."""
    body = await gw.body(request)
    if not body.strip():
        body = b"{}"
    try:
        return msgspec.json.decode(body, type=kind, strict=not numbers)
    except msgspec.ValidationError as exc:
        raise Problem(400, "invalid-request", f"the JSON body: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise Problem(400, "invalid-request", f"the body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise Problem(
            400, "invalid-request", f"the JSON body nests deeper than {MAX_DEPTH} levels"
        ) from None


def _name(request: Request) -> str:
    params = request.path_params
    for key in ("namespace", "name"):
        if key in params and not DNS_LABEL.match(params[key]):
            raise Problem(404, "not-found", f"no workflow: {params[key]!r} is not a name")
    if "namespace" in params:
        return f"{params['namespace']}/{params['name']}"
    return str(params["name"])


def _guard(
    call: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """Answer the errors a route raises with the problem :mod:`interlock.client.error_table`
    names for each."""

    async def guarded(request: Request) -> Response:
        try:
            return await call(request)
        except InterlockError as exc:
            problem = as_problem(exc)
            if problem is None:
                raise
            raise problem from exc

    return guarded


# -- access ------------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]
GatewayHandler = Callable[[Request, "Gateway"], Awaitable[Response]]


def _checked(
    handler: GatewayHandler, check: Callable[[Gateway, Request], Awaitable[object]]
) -> Handler:
    @functools.wraps(handler)
    async def call(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        await check(gw, request)
        return await handler(request, gw)

    return call


def reads(handler: GatewayHandler) -> Handler:
    """A handler readers and operators may call (401/403 for others), given the gateway."""
    return _checked(handler, lambda gw, request: gw.reader(request))


def operates(what: str) -> Callable[[GatewayHandler], Handler]:
    """A handler only operators may call; the 403 says the caller may not ``what``."""

    def wrap(handler: GatewayHandler) -> Handler:
        return _checked(handler, lambda gw, request: gw.operator(request, what))

    return wrap


# -- handlers ----------------------------------------------------------------------------


@reads
async def list_workflows(request: Request, gw: Gateway) -> Response:
    return json_view(await gw.api.workflows())


@reads
async def get_workflow(request: Request, gw: Gateway) -> Response:
    version = None
    if "version" in request.query_params:
        version = int_param(request, "version", 1, 1, 1 << 31)
    detail = await gw.api.workflow(_name(request), version)
    # Runs per version, from the run index's listing of the workflow (a chunk at a time).
    counts = await gw.run_list.counts(f"{detail.namespace}/{detail.name}")
    runs = [
        views.VersionRuns(version=v, **{k: n for k, n in c.items() if k in RECORDED})
        for v, c in sorted(counts.items())
    ]
    return json_view(msgspec.structs.replace(detail, runs=runs))


@reads
async def list_agents(request: Request, gw: Gateway) -> Response:
    return json_view(await gw.api.agents())


@reads
async def list_queues(request: Request, gw: Gateway) -> Response:
    return await queue_listing(request, gw.api)  # a page at a time


@reads
async def agent_failures(request: Request, gw: Gateway) -> Response:
    return json_view(gw.failures.report())


@reads
async def list_runs(request: Request, gw: Gateway) -> Response:
    status = request.query_params.get("status")
    if status is not None and status not in RECORDED:
        raise Problem(400, "bad-parameter", f"status is one of {', '.join(RECORDED)}")
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    offset = int_param(request, "offset", 0, 0, 1 << 31)
    since, until = _time_param(request, "since"), _time_param(request, "until")
    waiting = request.query_params.get("waiting")
    if waiting is not None and not WAITING.match(waiting):
        raise Problem(
            400, "bad-parameter", f"waiting is KIND or KIND:NAME, KIND one of {', '.join(KINDS)}"
        )

    async def keep(found: list[views.RunSummary]) -> list[views.RunSummary]:
        if since or until:
            found = [r for r in found if _started_between(r.started_at, since, until)]
        if waiting:
            running = [r for r in found if r.status == RunStatus.RUNNING]
            filled = await reading.with_waiting(gw.api.ops, running, complete=True)
            found = reading.waiting_for(filled, waiting)
        return found

    found, more = await gw.run_list.page(
        workflow=request.query_params.get("workflow"),
        status=RunStatus.RUNNING if waiting and not status else status,
        offset=offset,
        limit=limit,
        keep=keep if since or until or waiting else None,
    )
    page = await reading.with_waiting(gw.api.ops, found, complete=True)
    return json_view(RunPage(runs=page, next_offset=offset + limit if more else None))


@operates("start runs")
async def start_run(request: Request, gw: Gateway) -> Response:
    req: StartRequest = await _json_body(gw, request, StartRequest)
    run_id = await gw.api.start(req.workflow, req.inputs, run_id=req.run_id, deadline=req.deadline)
    response = json_view(StartedResponse(run_id=run_id, workflow=req.workflow), 201)
    response.headers["Location"] = f"/runs/{run_id}"
    return response


@reads
async def get_run(request: Request, gw: Gateway) -> Response:
    return json_view(await gw.run_logs.describe(request.path_params["run_id"]))


@reads
async def get_result(request: Request, gw: Gateway) -> Response:
    run_id = request.path_params["run_id"]
    timeout = _seconds_param(request, "timeout", 0.0)
    if timeout <= 0:
        return json_view(await gw.api.result(run_id))
    try:
        return json_view(await gw.api.result(run_id, wait=True, timeout=timeout))
    except TimeoutError:
        # Still running: say so, as without a wait (the caller polls again).
        return json_view(await gw.api.result(run_id))


@reads
async def get_log(request: Request, gw: Gateway) -> Response:
    run_id = request.path_params["run_id"]
    limit = int_param(request, "limit", 200, 1, 5000)
    offset = int_param(request, "offset", 0, 0, 1 << 31)
    # The page's records as they are kept (their JSON): the shape of LogPage.
    return Response(await gw.run_logs.page(run_id, offset, limit), media_type="application/json")


@reads
async def explain_run(request: Request, gw: Gateway) -> Response:
    """Why the run went where it went, step by step (every guard weighed, with the values
    it read), and what would move it now: ``interlock explain --json``."""
    at = None
    if "at" in request.query_params:
        at = int_param(request, "at", 1, 1, 1 << 31)
    return await _redecided(gw, request, lambda records: debugging.explain(gw.api.ops, records, at))


@reads
async def replay_run(request: Request, gw: Gateway) -> Response:
    """What another stored version of its workflow would have done with the run's recorded
    inputs (``interlock replay RUN_ID --against VERSION --json``); nothing is written."""
    if "against" not in request.query_params:
        raise Problem(400, "bad-parameter", "against: a stored version of the run's workflow")
    # A number only: Client.replay takes a string as a manifest file on this host.
    against = int_param(request, "against", 1, 1, 1 << 31)
    return await _redecided(
        gw, request, lambda records: debugging.replay(gw.api.ops, records, against)
    )


async def _redecided(
    gw: Gateway, request: Request, decide: Callable[[list[Any]], Awaitable[Any]]
) -> Response:
    """``decide`` on the run's log, as a JSON view (a ValueError: 400 bad-parameter)."""
    async with gw.run_logs.redrive(request.path_params["run_id"]) as cached:
        # Decided on the payloads kept by reference, loaded, as the run decided on them.
        records = await gw.api.ops.payloads.loaded(list(cached.records))
        try:
            return json_view(await decide(records))
        except ValueError as exc:
            raise Problem(400, "bad-parameter", str(exc)) from exc


@operates("cancel runs")
async def cancel_run(request: Request, gw: Gateway) -> Response:
    req: CancelRequest = await _json_body(gw, request, CancelRequest)
    run_id = request.path_params["run_id"]
    cancelled = await gw.api.cancel(run_id, req.reason)
    return json_view(CancelResponse(run_id=run_id, cancelled=cancelled))


@operates("signal runs")
async def signal_run(request: Request, gw: Gateway) -> Response:
    body = await gw.body(request)
    try:
        data = decode_json(body, "the body (the data)") if body.strip() else None
    except msgspec.DecodeError as exc:
        raise Problem(400, "invalid-request", f"the body (the data) is not JSON: {exc}") from exc
    except InvalidCloudEvent as exc:  # nested too deep
        raise Problem(400, "invalid-request", str(exc), reason=exc.reason) from exc
    if is_marker(data):
        # The gateway names its own uploads: a caller's reference would have it name
        # whatever object the caller chose.
        raise Problem(
            400,
            "invalid-reference",
            "the body is a reference to a stored object ($object): send a signal's data whole",
        )
    wait = _seconds_param(request, "wait", 5.0)
    result = await gw.api.signal(
        request.path_params["run_id"],
        request.path_params["name"],
        data,
        source="interlock://gateway",
        wait=wait,
    )
    return json_view(result)


@reads
async def list_dead_letters(request: Request, gw: Gateway) -> Response:
    return json_view(await gw.api.dead_letters(request.query_params.get("reason")))


def _seq(request: Request) -> int:
    raw = str(request.path_params["seq"])
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_SEQ:
        raise Problem(
            400, "bad-parameter", f"a dead letter's seq is a number from 1 to {MAX_SEQ}, not {raw}"
        )
    return int(raw)


@reads
async def get_dead_letter(request: Request, gw: Gateway) -> Response:
    return json_view(await gw.api.dead_letter(_seq(request)))


@operates("redrive dead letters")
async def redrive_dead_letter(request: Request, gw: Gateway) -> Response:
    seq = _seq(request)
    stored = await gw.api.redrive(seq)
    return json_view(RedriveResponse(seq=seq, stored=stored))


def routes(
    more: Iterable[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = (),
) -> list[BaseRoute]:
    """The API's routes, and ``more`` (path, handler, methods) beside them (a path's
    methods share one route)."""
    from interlock.gateway import live

    get, post = ["GET"], ["POST"]
    table: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
        ("/workflows", list_workflows, get),
        ("/workflows/{name}", get_workflow, get),
        ("/workflows/{namespace}/{name}", get_workflow, get),
        ("/agents", list_agents, get),
        ("/queues", list_queues, get),
        ("/runs", list_runs, get),
        ("/runs", start_run, post),
        ("/runs/{run_id}", get_run, get),
        ("/runs/{run_id}/result", get_result, get),
        ("/runs/{run_id}/log", get_log, get),
        ("/runs/{run_id}/log/stream", reads(live.stream_log), get),
        ("/runs/{run_id}/explain", explain_run, get),
        ("/runs/{run_id}/replay", replay_run, get),
        ("/runs/{run_id}/cancel", cancel_run, post),
        ("/runs/{run_id}/signals/{name}", signal_run, post),
        ("/dead-letters", list_dead_letters, get),
        ("/dead-letters/{seq}", get_dead_letter, get),
        ("/dead-letters/{seq}/redrive", redrive_dead_letter, post),
        ("/live/runs", reads(live.stream_runs), get),
        ("/agents/failures", agent_failures, get),
        *more,
    ]
    by_path: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
    for path, handler, methods in table:
        for method in methods:
            by_path.setdefault(path, {})[method] = _guard(handler)
    return [
        Route(path, _dispatch(handlers), methods=list(handlers))
        for path, handlers in by_path.items()
    ]


def _dispatch(
    handlers: dict[str, Callable[[Request], Awaitable[Response]]],
) -> Callable[[Request], Awaitable[Response]]:
    """One route per path (so a 405 lists every method of the path), by method."""

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](request)

    return dispatch
