"""The JavaScript publisher and a limited capability of examples/agents-js, under Node.

Auth is on, and each party holds the credential an operator gives it: the publisher posts
over HTTP with a publisher token (``interlock tokens create --role publisher``) and over
NATS with a publisher credential (``interlock creds issue publisher``); the worker serves
``demo.quote``, whose AgentDef allows one call at once and 5 a second per account. Events
start runs, a type outside the publisher's patterns is refused on both ways with a reason,
data over the threshold goes by reference, the orchestrator keeps the capability's calls
one at a time, and a cancelled call's answer gives its slot to the next at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.core import events as ev
from interlock.core.objects import parse_ref
from support.node import (
    SUBJECTS,
    WAIT,
    JsStack,
    cli,
    copy_example,
    http_gateway,
    node_or_skip,
    run_node,
    secured_stack,
    start_worker,
)

pytestmark = pytest.mark.timeout(120)

SOURCE = "https://shop.example/orders"


def _answer(out: str) -> dict[str, object]:
    """The publisher's one line of JSON."""
    [line] = [line for line in out.splitlines() if line.startswith("{")]
    answer = json.loads(line)
    assert isinstance(answer, dict), out
    return answer


async def _token(js: JsStack, name: str, events: str) -> str:
    """A publisher token, made as an operator makes it (``interlock tokens create``)."""
    code, out = await cli(
        "tokens", "create", name, "--role", "publisher", "--events", events,
        "--server", js.server.url, "--creds", str(js.auth.operator),
    )  # fmt: skip
    assert code == 0, out
    return out.strip().splitlines()[-1]


async def test_a_javascript_publisher_starts_runs_of_a_limited_capability(
    tmp_path: Path,
) -> None:
    node, npm = node_or_skip()
    app = copy_example(npm, tmp_path)
    async with (
        secured_stack(tmp_path / "data") as js,
        http_gateway(js.server.url, js.auth.gateway) as http,
    ):
        client = js.client
        agent = await js.issue("agent", "--capability", "demo.quote", out=tmp_path / "q.creds")
        publisher = await js.issue(
            "publisher", "--events", "acme.>", "--name", "shop", out=tmp_path / "shop.creds"
        )
        token = await _token(js, "shop-http", "acme.>")
        worker = await start_worker(
            node,
            app,
            {
                "INTERLOCK_URL": js.server.url,
                "INTERLOCK_CREDS": str(agent),
                "WORKER_NAME": "quoter-js",
                "CAPABILITIES": "demo.quote",
            },
        )
        over_http = {"INTERLOCK_HTTP": http, "INTERLOCK_TOKEN": token, "EVENT_SOURCE": SOURCE}
        over_nats = {
            "INTERLOCK_URL": js.server.url,
            "INTERLOCK_CREDS": str(publisher),
            "EVENT_SOURCE": SOURCE,
        }

        async def publish(
            env: dict[str, str], event_id: str, data: str, type_: str = "acme.quote.requested"
        ) -> tuple[int, dict[str, object]]:
            code, out = await run_node(
                node, app, "publisher.mjs", type_, data, env=env | {"EVENT_ID": event_id}
            )
            return code, _answer(out)

        try:
            await worker.wait_for("serving", "demo.quote")

            # Over HTTP, with a publisher token: stored, and told no more (which runs it
            # starts is not a publisher's to read).
            code, answer = await publish(over_http, "h1", '{"account": "a1"}')
            assert code == 0, answer
            assert (answer["status"], answer["duplicate"], answer["started"]) == (202, False, [])
            state = await client.wait(js.run_id("quote", SOURCE, "h1"), timeout=WAIT)
            assert (state.status, state.outputs) == (
                "completed",
                {"quote": "quote for a1", "note_length": 0},
            )

            # Over NATS, with a publisher credential: the stream's acknowledgement; three
            # runs of one account, whose calls the orchestrator keeps one at a time.
            for n in range(3):
                code, answer = await publish(
                    over_nats, f"n{n}", '{"account": "a2", "wait_seconds": 0.2}'
                )
                assert code == 0, answer
                assert answer["stream"] == SUBJECTS.events_stream
            runs = [js.run_id("quote", SOURCE, f"n{n}") for n in range(3)]
            for run in runs:
                assert (await client.wait(run, timeout=WAIT)).status == "completed"
            calls = [
                line.split()[2]
                for line in worker.lines
                if line.split()[1:4] in (["quote", "start", "a2"], ["quote", "end", "a2"])
            ]
            assert calls == ["start", "end"] * 3, worker.lines
            [requested] = [
                r for r in await client.read(runs[0]) if isinstance(r, ev.ActionRequested)
            ]
            limits = {(claim.limit, claim.key) for claim in requested.data.limits}
            assert limits == {("cap:demo.quote", "a2"), ("cap:demo.quote:rate", "a2")}, limits

            # A type outside the patterns: refused on both ways, saying so; nothing stored.
            stored = (await client.js.stream_info(SUBJECTS.events_stream)).state.messages
            code, answer = await publish(over_http, "x1", "{}", "other.quote.requested")
            assert (code, answer["refused"]) == (1, 403), answer
            assert "may not publish other.quote.requested" in str(answer["detail"])
            code, answer = await publish(over_nats, "x2", "{}", "other.quote.requested")
            assert (code, answer["refused"]) == (1, "PERMISSIONS_VIOLATION"), answer
            assert "il.events.other.quote.requested" in str(answer["detail"])
            info = await client.js.stream_info(SUBJECTS.events_stream)
            assert info.state.messages == stored

            # Data over the threshold goes by reference, into the publisher's own bucket.
            big = tmp_path / "big.json"
            big.write_text(json.dumps({"account": "a3", "note": "x" * 400_000}))
            code, answer = await publish(over_nats, "big", f"@{big}")
            assert code == 0, answer
            run = js.run_id("quote", SOURCE, "big")
            state = await client.wait(run, timeout=WAIT)
            assert (state.status, state.outputs) == (
                "completed",
                {"quote": "quote for a3", "note_length": 400_000},
            )
            [begun] = [r for r in await client.read(run) if isinstance(r, ev.RunStarted)]
            assert begun.data.trigger is not None
            # (sent as a reference, copied into the run's own objects as it started)
            ref = parse_ref(begun.data.trigger["data"])
            assert ref.bucket == SUBJECTS.objects_bucket, ref
            assert ref.size > 400_000, ref

            # A call cancelled while it runs: the worker stops it and answers, and that
            # answer gives the account's one slot to the call waiting behind it, where the
            # orchestrator would hold it 30 s for a worker that never answers.
            code, _ = await publish(over_nats, "long", '{"account": "a4", "wait_seconds": 60}')
            assert code == 0
            long = js.run_id("quote", SOURCE, "long")
            await worker.wait_for("quote start a4", long)
            code, _ = await publish(over_nats, "next", '{"account": "a4"}')
            assert code == 0
            assert await client.cancel(long)
            await worker.wait_for("answered", long, "task.failed")
            state = await client.wait(js.run_id("quote", SOURCE, "next"), timeout=WAIT)
            assert state.status == "completed", state
            assert not [line for line in worker.lines if "ignores its cancellation" in line]
        finally:
            assert await worker.stop() == 0, "\n".join(worker.lines)
