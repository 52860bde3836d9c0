"""The uploads bucket (where the gateway keeps an event's data over 256 KiB) is shared by
every HTTP caller who may post events, publishers included, and kept 7 days: bounded by
its operator (``max_bytes`` on its stream, which provisioning keeps), a caller's event
that would not fit is refused with a problem (507 ``uploads-full``), nothing published,
where it came back as an error the caller could not read (a real nats-server, HTTP over
a socket, a publisher's token)."""

from __future__ import annotations

import pytest

from interlock.transport.provision import provision
from interlock.transport.subjects import Subjects
from support.gateway import gateway_stack

pytestmark = pytest.mark.asyncio


def _event(n: int) -> dict[str, str]:
    return {
        "ce-specversion": "1.0", "ce-id": f"big-{n}", "ce-source": "https://ci.example",
        "ce-type": "com.example.upload", "Content-Type": "application/json",
    }  # fmt: skip


async def test_an_event_past_the_uploads_bound_is_refused(
    nats_url: str, subjects: Subjects
) -> None:
    async with gateway_stack(nats_url, subjects, max_body=1 << 20) as gs:
        js = gs.stack.js
        stream = f"OBJ_{subjects.uploads_bucket}"
        config = (await js.stream_info(stream)).config
        config.max_bytes = 700_000  # the operator's bound
        await js.update_stream(config)
        await provision(js, subjects)  # as every process does at start: the bound stays
        assert (await js.stream_info(stream)).config.max_bytes == 700_000
        async with gs.http("publisher") as http:
            first = await http.post(
                "/events", headers=_event(1), content=b'"' + b"a" * 400_000 + b'"'
            )
            assert first.status_code < 300, first.text
            stored = await gs.stored_events()
            second = await http.post(
                "/events", headers=_event(2), content=b'"' + b"b" * 400_000 + b'"'
            )
        assert second.status_code == 507, second.text
        problem = second.json()
        assert problem["type"].endswith("/uploads-full")
        assert "is full" in problem["detail"]
        assert await gs.stored_events() == stored  # nothing published
