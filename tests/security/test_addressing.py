"""What an external publisher may target: event types, never a run by its id.

Every refusal is tried as the publisher that would try it, with a plain nats-py client on
its own credentials: the subject of events addressed to one run (``il.events.@run.<run>.
<type>``) is refused by NATS even to a publisher of every type (``>``); what NATS lets
through on the publisher's own subjects (a ``runid`` extension, a type other than the
subject's, an answer's type) the orchestrator dead-letters with its reason, and the run's
log stays as it was. The operator's ways to address a run (``signal``, ``emit`` with a
``runid``, a plain publish on the run's subject) keep working."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from interlock import Client
from interlock.auth.roles import Role
from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.runtime.runs import UnknownRun, utc_now
from interlock.transport.cloudevents import CloudEvent, encode_binary
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

APPROVED = "acme.order.approved"


def _event(event_id: str, type_: str = APPROVED, **extensions: str) -> CloudEvent:
    return CloudEvent(
        id=event_id,
        source="https://acme.example/shop",
        type=type_,
        time=utc_now(),
        datacontenttype="application/json",
        data={"approver": "mallory"},
        extensions=extensions,
    )


async def _waiting_run(secured: Secured) -> str:
    run_id = await secured.operator.start("awaiting", {})
    async for record in secured.operator.follow(run_id, idle_timeout=30):
        if isinstance(record, ev.StateEntered) and record.data.state == "waiting":
            return run_id
    raise AssertionError("the run never waited")


async def _log(secured: Secured, run_id: str) -> list[bytes]:
    return [msgspec.json.encode(r) for r in await secured.operator.read(run_id)]


async def _letter(secured: Secured, reason: str, event_id: str) -> str:
    """The detail of the dead letter of ``reason`` holding the event ``event_id``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        for letter in await secured.operator.dead_letters(reason):
            if event_id.encode() in letter.data or event_id in letter.headers.values():
                return letter.detail
        assert loop.time() < deadline, f"no dead letter {reason} for {event_id}"
        await asyncio.sleep(0.1)


async def _creds(secured: Secured, name: str, *patterns: str) -> Path:
    return secured.issued.get(name) or secured.issue(Role("publisher", events=patterns), name)


@pytest.mark.parametrize("patterns", [("acme.order.>",), (">",)], ids=["own-types", "every-type"])
async def test_nats_refuses_a_publisher_the_subject_of_a_run(
    secured: Secured, patterns: tuple[str, ...]
) -> None:
    run_id = await _waiting_run(secured)
    before = await _log(secured, run_id)
    creds = await _creds(secured, f"publisher-{len(patterns[0])}", *patterns)
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)  # type: ignore[arg-type]
    subject = SUBJECTS.addressed(run_id, APPROVED)
    assert subject == f"il.events.@run.{run_id}.{APPROVED}"
    try:
        headers, payload = encode_binary(_event(f"to-run-{patterns[0]}", runid=run_id))
        await nc.publish(subject, payload, headers=headers)
        await nc.flush()
        await refusals.wait_for("permissions violation", "publish", subject)
    finally:
        await nc.close()
    # What the operator then sends on the same subject is taken: nothing of the above was.
    headers, payload = encode_binary(_event("ok-op"))
    await secured.operator.js.publish(subject, payload, headers=headers)
    state = await secured.operator.wait(run_id, timeout=30)
    assert state.status == "completed"
    records = await secured.operator.read(run_id)
    received = [r for r in records if isinstance(r, ev.EventReceived)]
    assert [r.data.event["id"] for r in received] == ["ok-op"]
    # The subject named the run: the recorded copy says so as a signal's does.
    assert received[0].data.event["runid"] == run_id
    assert [msgspec.json.encode(r) for r in records[: len(before)]] == before


@pytest.mark.parametrize(
    ("case", "reason", "subject_type", "event_type", "extensions"),
    [
        ("runid", "runid-refused", APPROVED, APPROVED, {"runid": "{run}"}),
        ("other type", "type-mismatch", APPROVED, "acme.echo.requested", {}),
        ("answer type", "reserved-attribute", "task.completed", "task.completed", {}),
        ("actionid", "reserved-attribute", APPROVED, APPROVED, {"actionid": "{run}:1"}),
        ("timerid", "reserved-attribute", APPROVED, APPROVED, {"timerid": "{run}:t"}),
    ],
)
async def test_what_nats_lets_a_publisher_send_the_orchestrator_dead_letters(
    secured: Secured,
    case: str,
    reason: str,
    subject_type: str,
    event_type: str,
    extensions: dict[str, str],
) -> None:
    """On its own subjects (``>``: it may publish every type), a publisher's event that
    names a run, speaks for an action or a timer, or is typed unlike its subject never
    reaches a log, and starts nothing."""
    run_id = await _waiting_run(secured)
    before = await _log(secured, run_id)
    creds = await _creds(secured, "publisher-every-type", ">")
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)  # type: ignore[arg-type]
    event = _event(
        f"forged-{case.replace(' ', '-')}",
        event_type,
        **{k: v.format(run=run_id) for k, v in extensions.items()},
    )
    try:
        headers, payload = encode_binary(event)
        ack = await nc.jetstream().publish(SUBJECTS.event(subject_type), payload, headers=headers)
        assert ack.seq > 0  # NATS took it: the subject is this publisher's own
    finally:
        await nc.close()
    assert not refusals.errors
    detail = await _letter(secured, reason, event.id)
    assert detail
    # Decided on (dead-lettered) and the run unchanged, still waiting.
    assert await _log(secured, run_id) == before
    state = await secured.operator.state(run_id)
    assert (state.status, state.state) == ("running", "waiting")
    if event_type == "acme.echo.requested":  # the trigger of ``echoing``: nothing started
        definition, _ = await secured.operator.registry.latest("echoing")
        with pytest.raises(UnknownRun):
            await secured.operator.read(derive_run_id(definition, event.source, event.id))


async def test_a_runid_is_refused_with_its_reason(secured: Secured) -> None:
    run_id = await _waiting_run(secured)
    creds = await _creds(secured, "publisher-own", "acme.order.>")
    nc = await plain_client(secured.url, creds, Refusals())  # type: ignore[arg-type]
    event = _event("steer-1", runid=run_id)
    try:
        headers, payload = encode_binary(event)
        await nc.jetstream().publish(SUBJECTS.event(APPROVED), payload, headers=headers)
    finally:
        await nc.close()
    detail = await _letter(secured, "runid-refused", event.id)
    assert "may not carry runid" in detail
    assert "il.events.@run.<run>.<type>" in detail


async def test_the_operator_signals_and_emits_to_a_run(secured: Secured) -> None:
    """``signal`` and ``emit`` with a ``runid`` (the operator's) still reach the run."""
    client = Client(secured.operator.nc, SUBJECTS)
    signalled = await _waiting_run(secured)
    result = await client.signal(signalled, APPROVED, {"approver": "ada"}, wait=30)
    assert result.outcome == "moved", result
    emitted = await _waiting_run(secured)
    await client.emit(_event("emit-1", runid=emitted))
    for run_id in (signalled, emitted):
        state = await secured.operator.wait(run_id, timeout=30)
        assert state.status == "completed"
