"""A ``traceparent`` is the publisher's text: the run an event starts keeps it (its records,
the console's trace link) and hands it on to every task of the run (other teams' agents
receive it as a header). What is kept and handed on is a W3C trace context or nothing:
a publisher's junk there (a path and query for the console's trace link, or kilobytes)
reaches no record and no agent. The publisher on its own credential as ``interlock creds
issue`` makes it, on a real nats-server with Interlock's decentralized auth."""

from __future__ import annotations

import re

import pytest

from interlock.core import events as ev
from interlock.core.incoming import derive_run_id
from support.auth import Secured, publish_event, publisher, secured, secured_server

__all__ = ["secured", "secured_server"]  # the fixtures, used by name

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

TRACE_CONTEXT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def _records(secured: Secured, event_id: str) -> list[ev.AnyRecord]:
    """The records of the run the event starts, up to its task's request (then cancelled)."""
    definition, _ = await secured.operator.registry.latest("guarded")
    run_id = derive_run_id(definition, "https://publisher.example", event_id)
    records: list[ev.AnyRecord] = []
    async for record in secured.operator.follow(run_id, idle_timeout=30):
        records.append(record)
        if isinstance(record, ev.ActionRequested):
            break
    await secured.operator.cancel(run_id)
    return records


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("00-../../admin?x=1-b7ad6b7169203331-01", None),
        # Its four fields taken, not the 20 KB after them.
        ("00-" + "a" * 32 + "-" + "b" * 16 + "-01" + "x" * 20_000, f"00-{'a' * 32}-{'b' * 16}-01"),
        (VALID.upper(), VALID),
        (VALID, VALID),
    ],
)
async def test_a_publishers_traceparent_is_kept_only_as_a_trace_context(
    secured: Secured, given: str, kept: str | None
) -> None:
    nc, refusals = await publisher(secured, "acme.>", "acme-trace")
    event_id = f"trace-{len(given)}-{given[:8]}-{kept is None}"
    try:
        await publish_event(nc, event_id, "acme.order.placed", {}, headers={"traceparent": given})
    finally:
        await nc.close()
    assert not refusals.errors
    records = await _records(secured, event_id)
    [started] = [r for r in records if isinstance(r, ev.RunStarted)]
    assert started.traceparent == kept
    # Junk is kept by no record, so handed to no agent with a task.
    kept_by = {r.traceparent for r in records} - {None}
    assert all(TRACE_CONTEXT.fullmatch(t) for t in kept_by), kept_by
