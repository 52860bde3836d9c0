"""Executing one task: what a worker does between taking a request and answering it.

Check the deadline and the input (the capability's schema, the handler's input type),
run the handler within the deadline, stop it when the task is cancelled, and turn what it
returned or raised into the answer's ``(type, data)``. The serving loop around it (pulling,
acks, publishing the answer, cancel notices, heartbeats) is :mod:`interlock.sdk.serving`
and :mod:`interlock.sdk.taking`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.aio.msg import Msg

from interlock.core.rfc3339 import format_time
from interlock.transport.pulling import deliveries
from interlock.transport.tasks import HANDLER_RUNNING, TaskRequest, failure

from .context import TASK_COMPLETED, Emit, TaskContext
from .errors import AgentError, ErrorClass
from .schemas import CapabilityContract, Schema

log = logging.getLogger("interlock.sdk")

Handler = Callable[..., Awaitable[Any]]

CANCEL_CLEANUP = 5.0
"""How long a handler gets to finish after being cancelled before the answer goes
without it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Capability:
    """A registered capability: its handler and what the worker knows of it."""

    name: str
    handler: Handler
    input_type: type | None
    takes_context: bool
    contract: CapabilityContract
    description: str | None


class Abandon(Exception):
    """The task is handed back unanswered (worker stopping)."""


class InFlight:
    """One attempt being handled, and why it was stopped (if it was)."""

    __slots__ = ("attempt", "reason", "task")

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt
        self.reason: str | None = None  # "cancelled" | "timeout" | "shutdown"
        self.task: asyncio.Task[Any] | None = None

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self.task is not None:
            self.task.cancel()


class _Refused(Exception):
    """The task is answered without running the handler (the answer's type and data)."""

    def __init__(self, answer: tuple[str, Any]) -> None:
        super().__init__(answer[0])
        self.answer = answer


def start(
    cap: Capability,
    contract: CapabilityContract,
    request: TaskRequest,
    msg: Msg,
    flight: InFlight,
    *,
    worker: str,
    handler_log: logging.Logger,
) -> tuple[str, Any] | None:
    """Check the task and start its handler as ``flight.task``, in a task of its own made in
    the caller's context: None then, else the answer's (type, data), given without running
    it (a refused input, a passed deadline, a task cancelled before it started).

    A plain call: the worker makes it in the read loop that delivered the task, so the
    handler's first step runs at the loop's next turn.

    Raises:
        Abandon: the worker is stopping: hand the task back.
    """
    if flight.reason is not None:  # cancelled before the handler started
        return stopped(flight, request, cap)
    try:
        argument = _argument(cap, contract, request)
    except _Refused as refused:
        return refused.answer
    if cap.takes_context:
        ctx = TaskContext(
            event=request.event,
            run_id=request.run_id,
            action_id=request.action_id,
            attempt=request.attempt,
            capability=cap.name,
            deadline=request.deadline,
            worker=worker,
            delivery=delivery_count(msg),
            progress=msg.in_progress,
            logger=logging.LoggerAdapter(
                handler_log, {"run_id": request.run_id, "action_id": request.action_id}
            ),
        )
        call = cap.handler(argument, ctx)
    else:  # no context to build (its delivery count parses the message's reply subject)
        call = cap.handler(argument)
    # A coroutine (handlers are async functions): its task made without ensure_future's checks.
    flight.task = asyncio.get_running_loop().create_task(
        typing.cast("Coroutine[Any, Any, Any]", call)
    )
    return None


async def finish(
    cap: Capability, contract: CapabilityContract, request: TaskRequest, flight: InFlight
) -> tuple[str, Any]:
    """Wait for the handler :func:`start` started (within its deadline), validate its
    output: the answer's (type, data).

    Raises:
        Abandon: the worker is stopping and the handler did not finish: hand it back.
    """
    task = flight.task
    assert task is not None
    await _run(task, request, flight, cap.name)
    return answer_of(cap, contract, request, flight)


def answer_of(
    cap: Capability, contract: CapabilityContract, request: TaskRequest, flight: InFlight
) -> tuple[str, Any]:
    """The answer's (type, data) once the handler's task is done, or given up on (what
    :func:`finish` returns after its wait; called at once when there is nothing to wait
    for).

    Raises:
        Abandon: the worker is stopping and the handler did not finish: hand it back.
    """
    task = flight.task
    assert task is not None
    if flight.reason is not None and not (flight.reason == "shutdown" and succeeded(task)):
        return stopped(flight, request, cap, running=not task.done())
    if task.cancelled():
        return failure(ErrorClass.CANCELLED, "the handler was cancelled", retryable=True)
    error = task.exception()
    if isinstance(error, AgentError):
        return failure(
            ErrorClass.AGENT_ERROR,
            error.message,
            retryable=error.retryable,
            code=error.code,
            retry_after=error.retry_after,
        )
    if error is not None:
        log.error("%s handler failed on %s", cap.name, request.action_id, exc_info=error)
        # An unexpected exception may well be transient: let the retry policy decide.
        return failure(ErrorClass.AGENT_ERROR, f"{type(error).__name__}: {error}", retryable=True)
    return output(cap, contract, task.result())


def _argument(cap: Capability, contract: CapabilityContract, request: TaskRequest) -> Any:
    """The handler's argument: the input, checked (deadline, JSON object, schema, type).

    Raises:
        _Refused: with the answer to give instead of running the handler.
    """
    if request.deadline_problem:
        log.warning("task %s: %s; running without one", request.action_id, request.deadline_problem)
    if request.deadline is not None and datetime.now(UTC) >= request.deadline:
        raise _Refused(
            failure(
                ErrorClass.TIMEOUT,
                f"deadline {format_time(request.deadline)} had passed when the task was received",
                retryable=True,
            )
        )
    data = request.event.data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _Refused(
            failure(
                ErrorClass.SCHEMA_ERROR,
                f"the input of {cap.name!r} must be a JSON object, got {type(data).__name__}",
                retryable=False,
            )
        )
    mismatch = schema_mismatch("input", cap.name, contract.input, contract.origin, data)
    if mismatch is not None:
        raise _Refused(mismatch)
    if cap.input_type is None:
        return data
    try:
        return msgspec.convert(data, cap.input_type)
    except msgspec.ValidationError as exc:
        raise _Refused(
            failure(
                ErrorClass.SCHEMA_ERROR,
                f"input does not fit {cap.input_type.__name__}: {exc}",
                retryable=False,
            )
        ) from None


async def _run(task: asyncio.Task[Any], request: TaskRequest, flight: InFlight, name: str) -> None:
    """Let the handler run until its deadline (then stop it) and its clean-up is over."""
    timeout = None
    if request.deadline is not None:
        timeout = max((request.deadline - datetime.now(UTC)).total_seconds(), 0.0)
    if not await settled(task, timeout):
        flight.stop("timeout")
    if not task.done() and not await settled(task, CANCEL_CLEANUP):
        log.warning("the %s handler ignores cancellation; answering without it", name)


async def settled(task: asyncio.Future[Any], seconds: float | None) -> bool:
    """Wait until ``task`` is done, or ``seconds`` (None: no limit) have passed;
    whether it is done. The task is never cancelled here, nor when the wait is.

    What ``asyncio.wait({task}, timeout=...)`` does for one task, without its sets and
    checks: it is on the path of every task a worker runs.
    """
    if task.done():
        return True
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    timer = None if seconds is None else loop.call_later(seconds, wake)
    try:
        await waiter
    finally:
        task.remove_done_callback(wake)
        if timer is not None:
            timer.cancel()
    return task.done()


def stopped(
    flight: InFlight, request: TaskRequest, cap: Capability, *, running: bool = False
) -> tuple[str, Any]:
    """The answer of a task stopped before it finished (timed out, cancelled); sent once
    the handler has ended, or (``running``) without it when it ignored its cancellation,
    which a cancelled attempt's answer then says (the orchestrator keeps its concurrency
    slot held a while longer)."""
    if flight.reason == "timeout":
        assert request.deadline is not None
        return failure(
            ErrorClass.TIMEOUT,
            f"{cap.name!r} did not finish before its deadline {format_time(request.deadline)}",
            retryable=True,
        )
    if flight.reason == "cancelled":
        code = HANDLER_RUNNING if running else None
        return failure(
            ErrorClass.CANCELLED, "cancelled by the orchestrator", retryable=False, code=code
        )
    raise Abandon


def output(cap: Capability, contract: CapabilityContract, value: Any) -> tuple[str, Any]:
    """The answer of a handler that returned ``value``."""
    result_type, data = (
        (value.type, value.data) if isinstance(value, Emit) else (TASK_COMPLETED, value)
    )
    try:
        data = msgspec.to_builtins(data)
    except (TypeError, msgspec.EncodeError) as exc:
        return failure(
            ErrorClass.SCHEMA_ERROR,
            f"the output of {cap.name!r} is not JSON-serialisable: {exc}",
            retryable=False,
        )
    if data is None:
        data = {}
    if result_type == TASK_COMPLETED and not isinstance(data, dict):
        return failure(
            ErrorClass.SCHEMA_ERROR,
            f"the output of {cap.name!r} must be a JSON object, got {type(data).__name__}",
            retryable=False,
        )
    mismatch = schema_mismatch("output", cap.name, contract.output, contract.origin, data)
    if mismatch is not None:
        return mismatch
    return result_type, data


def schema_mismatch(
    side: str, capability: str, schema: Schema | None, origin: str, data: Any
) -> tuple[str, Any] | None:
    """The schema-error result when ``data`` does not match the ``side`` (input or output)
    schema of ``capability``; None when it does or there is no schema."""
    if schema is None:
        return None
    problem = schema.problem(data)
    if problem is None:
        return None
    return failure(
        ErrorClass.SCHEMA_ERROR,
        f"{side} does not match the {side} schema of {capability!r} ({origin}): {problem}",
        retryable=False,
    )


def inspect_handler(fn: Handler, name: str) -> tuple[type | None, bool]:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not params or len(params) > 2:
        raise TypeError(f"the handler of {name!r} must take (input) or (input, ctx)")
    try:
        hints = typing.get_type_hints(fn)
    # Unresolvable forward references: treat the input as a dict.
    except Exception:  # noqa: BLE001
        hints = {}
    annotation = hints.get(params[0].name)
    input_type: type | None = None
    if isinstance(annotation, type) and (
        issubclass(annotation, msgspec.Struct) or dataclasses.is_dataclass(annotation)
    ):
        input_type = annotation
    return input_type, len(params) == 2


def succeeded(task: asyncio.Task[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def delivery_count(msg: Msg) -> int:
    try:
        return deliveries(msg)
    except ValueError:
        return 1
