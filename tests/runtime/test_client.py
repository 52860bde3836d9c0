"""``interlock.Client`` against a real nats-server: every call, and waiting at scale."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import interlock
from interlock import Client, SyncClient
from interlock.core import events as ev
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.subjects import Subjects
from interlock.views import RunDescription, record_view, to_builtins
from support.runtime import GATED, TIMEOUT, connect, running_stack, yaml

ECHO_FLOW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: echoflow
      description: echo a message
    spec:
      inputs:
        message: {type: string, required: true}
      triggers:
        - event: com.example.echo
          filter: {lang: en}
          input: {message: "{{ data.message }}"}
      initial_state: work
      states:
        work:
          actions:
            - capability: echo
              input: {message: "{{ inputs.message }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs:
            echoed: "$.states.work.output.message"
    """
)


async def test_the_package_exports_are_pinned() -> None:
    assert sorted(interlock.__all__) == sorted(
        [
            "Client",
            "CloudEvent",
            "ConnectOptions",
            "ConnectionFailed",
            "EventTooLarge",
            "InvalidInputs",
            "InvalidManifest",
            "InvalidRunId",
            "NotRedrivable",
            "RunNotEnded",
            "RunExists",
            "SyncClient",
            "UnknownAgent",
            "UnknownDeadLetter",
            "UnknownRun",
            "UnknownWorkflow",
            "__version__",
            "views",
        ]
    )
    for name in interlock.__all__:
        assert getattr(interlock, name) is not None
    with pytest.raises(AttributeError):
        _ = interlock.NoSuchThing  # type: ignore[attr-defined]


async def test_start_result_describe_runs_logs(nats_url: str, subjects: Subjects) -> None:
    async with (
        running_stack(nats_url, subjects, [ECHO_FLOW, GATED]),
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        run_id = await client.start("echoflow", {"message": "hi"})
        result = await client.result(run_id, wait=True, timeout=TIMEOUT)
        assert result.status == "completed"
        assert result.outputs == {"echoed": "hi"}
        assert result.finished_at

        summary = await client.run(run_id)
        assert (summary.workflow, summary.status, summary.state) == (
            "echoflow",
            "completed",
            "done",
        )
        records = [r async for r in client.logs(run_id)]
        assert records[0].id.endswith(":1")
        assert [r.id for r in await client.records(run_id)] == [r.id for r in records]
        tail = [r async for r in client.logs(run_id, tail=2)]
        assert [r.id for r in tail] == [r.id for r in records[-2:]]
        later = [r async for r in client.logs(run_id, since=records[-1].time)]
        assert later
        assert later[-1].id == records[-1].id

        gated = await client.start("gated", {})
        described = await client.describe(gated)
        assert isinstance(described, RunDescription)
        assert described.status == "running"
        assert described.state == "review"
        waits = {w.event: w for w in described.waiting_for}
        assert waits["approval.granted"].guard == "data.score > 7"
        assert waits["approval.granted"].kind == "event"
        assert waits["approval.denied"].goto == "denied"
        assert [t.purpose for t in described.timers] == ["state-timeout"]
        assert json.loads(json.dumps(to_builtins(described)))["run_id"] == gated

        # The run index is written by the orchestrator's relay: wait for both entries.
        async def both_indexed() -> list[str]:
            return [r.run_id for r in await client.runs()]

        for _ in range(1500):
            if {run_id, gated} <= set(await both_indexed()):
                break
            await asyncio.sleep(0.02)
        listed = await client.runs(workflow="echoflow")
        assert [r.run_id for r in listed] == [run_id]
        assert [r.run_id for r in await client.runs(status="running")] == [gated]
        assert len(await client.runs(limit=1)) == 1

        not_yet = await client.result(gated)
        assert not_yet.status == "running"
        with pytest.raises(TimeoutError):
            await client.result(gated, wait=True, timeout=0.2)
        assert await client.cancel(gated, "no longer needed")
        assert not await client.cancel(gated)
        cancelled = await client.result(gated, wait=True, timeout=TIMEOUT)
        assert cancelled.status == "cancelled"
        assert cancelled.reason == "no longer needed"

        with pytest.raises(interlock.UnknownRun):
            await client.result("rnosuchrun", wait=True, timeout=1)
        with pytest.raises(interlock.InvalidRunId):
            await client.describe("a.b>")
        with pytest.raises(interlock.UnknownWorkflow):
            await client.start("nosuch", {})
        with pytest.raises(interlock.InvalidInputs):
            await client.start("echoflow", {})


async def test_emit_says_which_runs_it_started(nats_url: str, subjects: Subjects) -> None:
    async with (
        running_stack(nats_url, subjects, [ECHO_FLOW]),
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        done = await client.emit(
            type="com.example.echo",
            source="test://emit",
            id="e1",
            data={"lang": "en", "message": "yo"},
        )
        assert done.matched
        assert [s.workflow for s in done.started] == ["echoflow"]
        assert not done.started[0].existed
        result = await client.result(done.started[0].run_id, wait=True, timeout=TIMEOUT)
        assert result.outputs == {"echoed": "yo"}

        again = await client.emit(
            type="com.example.echo",
            source="test://emit",
            id="e1",
            data={"lang": "en", "message": "yo"},
        )
        assert again.duplicate
        assert again.started[0].existed
        assert again.started[0].run_id == done.started[0].run_id

        nothing = await client.emit(
            {
                "specversion": "1.0",
                "type": "com.example.echo",
                "source": "test://emit",
                "id": "e2",
                "data": {"lang": "fr", "message": "salut"},
            }
        )
        assert not nothing.matched
        assert nothing.started == []


async def test_signal_reports_what_the_run_did(nats_url: str, subjects: Subjects) -> None:
    async with (
        running_stack(nats_url, subjects, [GATED]),
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        run_id = await client.start("gated", {})
        declined = await client.signal(run_id, "approval.granted", {"score": 3})
        assert declined.outcome == "declined"
        assert declined.state == "review"
        not_waiting = await client.signal(run_id, "merge.done")
        assert not_waiting.outcome == "not-waiting"
        assert not_waiting.waiting_for == ["approval.denied", "approval.granted"]
        moved = await client.signal(run_id, "approval.granted", {"score": 9})
        assert (moved.outcome, moved.state, moved.to_state) == ("moved", "review", "approved")
        result = await client.result(run_id, wait=True, timeout=TIMEOUT)
        assert result.outputs == {"ok": True}
        assert (await client.signal(run_id, "approval.denied")).outcome == "finished"


async def test_signal_without_an_orchestrator_is_unanswered(
    nats_url: str, subjects: Subjects
) -> None:
    async with await Client.connect(nats_url, prefix=subjects.prefix) as client:
        await client.apply([("gated.yaml", GATED)])
        run_id = await client.start("gated", {})
        assert await client.orchestrator_seen() is False
        told = await client.signal(run_id, "approval.granted", {"score": 9}, wait=0.3)
        assert told.outcome == "unanswered"


async def test_definitions_agents_and_delete(nats_url: str, subjects: Subjects) -> None:
    async with (
        running_stack(nats_url, subjects, [ECHO_FLOW]) as stack,
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        [wf] = await client.workflows()
        assert (wf.name, wf.version, wf.triggers) == ("echoflow", 1, ["com.example.echo"])
        assert wf.description == "echo a message"
        changed = ECHO_FLOW.replace("echo a message", "echo it")
        [applied] = await client.apply([("changed.yaml", changed)])
        assert applied.version == 2
        detail = await client.workflow("echoflow")
        assert (detail.version, detail.versions) == (2, [1, 2])
        assert detail.inputs == {"message": {"type": "string", "required": True}}
        assert detail.manifest["metadata"]["name"] == "echoflow"

        [agent] = await client.agents()
        assert agent.name == "testagent"
        assert {c.name for c in agent.capabilities} >= {"echo", "slow"}
        assert (await client.agent("testagent")).name == "testagent"
        with pytest.raises(interlock.UnknownAgent):
            await client.agent("nobody")
        with pytest.raises(interlock.InvalidManifest) as bad:
            await client.apply([("bad.yaml", "kind: Workflow\n")])
        assert bad.value.diagnostics

        # A run in flight keeps its version after the workflow is deleted.
        stack.recorder.release.clear()
        slow = GATED.replace("name: gated", "name: slowgated")
        await client.apply([("slow.yaml", slow)])
        in_flight = await client.start("slowgated", {})
        assert await client.delete_workflow("slowgated") == 1
        with pytest.raises(interlock.UnknownWorkflow):
            await client.start("slowgated", {})
        assert "slowgated" not in [w.name for w in await client.workflows()]
        assert (await client.describe(in_flight)).waiting_for  # still knows its states
        moved = await client.signal(in_flight, "approval.denied")
        assert moved.outcome == "moved"
        with pytest.raises(interlock.UnknownWorkflow):
            await client.delete_workflow("slowgated")


async def test_dead_letters_show_data_as_json_text_or_base64(
    nats_url: str, subjects: Subjects
) -> None:
    async with (
        running_stack(nats_url, subjects, []) as stack,
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        await stack.js.publish(subjects.event("x.y"), b"\xff\xfe not a cloudevent")
        for _ in range(500):
            letters = await client.dead_letters()
            if letters:
                break
            await asyncio.sleep(0.02)
        [letter] = letters
        assert letter.data is None
        assert base64.b64decode(letter.data_base64 or "") == b"\xff\xfe not a cloudevent"
        assert (await client.dead_letter(letter.seq)).seq == letter.seq
        with pytest.raises(interlock.UnknownDeadLetter):
            await client.dead_letter(letter.seq + 1000)


async def test_sync_client(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [ECHO_FLOW]):

        def drive() -> tuple[str, list[str]]:
            with SyncClient.connect(nats_url, prefix=subjects.prefix) as client:
                run_id = client.start("echoflow", {"message": "sync"})
                result = client.result(run_id, wait=True, timeout=TIMEOUT)
                types = [record_view(r)["type"] for r in client.logs(run_id)]
                return str(result.outputs), types

        outputs, types = await asyncio.to_thread(drive)
        assert outputs == "{'echoed': 'sync'}"
        assert types[0] == "io.interlock.run.started"
        assert types[-1] == "io.interlock.run.completed"


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server of its own with the monitoring endpoints on: what it counts of a
    connection's subscriptions and of the account's consumers is read from the server."""
    server = EmbeddedNats(tmp_path_factory.mktemp("monitored"), args=("-m", "-1"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def server_counts(server: EmbeddedNats, client: Client) -> tuple[int, int]:
    """(subscriptions the server holds for ``client``'s connection, JetStream consumers
    of the whole account), both as the server reports them."""
    url = f"{server.monitor_url}/connz?subs=1&cid={client.nc.client_id}"

    def fetch() -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return dict(json.load(answer))

    [conn] = (await asyncio.to_thread(fetch))["connections"]
    watcher_nc = await connect(server.url)
    try:
        account = await watcher_nc.jetstream().account_info()
    finally:
        await watcher_nc.close()
    return int(conn["subscriptions"]), int(account.consumers)


async def wait_until(check: Callable[[], bool]) -> None:
    for _ in range(2_000):
        if check():
            return
        await asyncio.sleep(0.05)
    assert check()


@pytest.mark.timeout(300)
async def test_5000_concurrent_waits_cost_one_subscription(
    monitored: EmbeddedNats, subjects: Subjects
) -> None:
    """5,000 ``result(wait=True)`` calls from one client at once, plus 1,000 waits of the
    operations underneath on the same runs: the server holds no more JetStream consumers
    than before and a handful of subscriptions for the client, however many wait.

    The runs wait for a human (no orchestrator is needed to start or cancel them: both are
    appends by the client), so the waits are all in flight together; cancelling every run
    ends every wait, each with its run's own result.
    """
    n = 5_000
    async with await Client.connect(monitored.url, prefix=subjects.prefix) as client:
        await client.apply([("gated.yaml", GATED)])
        gate = asyncio.Semaphore(200)

        async def start(i: int) -> str:
            async with gate:
                return await client.start("gated", {}, run_id=f"w{i}")

        run_ids = await asyncio.gather(*(start(i) for i in range(n)))
        subs_before, consumers_before = await server_counts(monitored, client)
        waits = [asyncio.create_task(client.result(r, wait=True, timeout=240)) for r in run_ids]
        ops_waits = [asyncio.create_task(client.ops.wait(r, 240)) for r in run_ids[:1_000]]
        await wait_until(lambda: client._watcher.watching == n)
        subs, consumers = await server_counts(monitored, client)
        assert consumers == consumers_before
        assert subs <= subs_before + 1  # the watcher's one subscription
        assert subs <= 4

        async def cancel(run_id: str) -> bool:
            async with gate:
                return await client.cancel(run_id, f"reason {run_id}")

        assert all(await asyncio.gather(*(cancel(r) for r in run_ids)))
        results = await asyncio.gather(*waits)
        assert [r.status for r in results] == ["cancelled"] * n
        assert [r.reason for r in results] == [f"reason {r}" for r in run_ids]
        states = await asyncio.gather(*ops_waits)
        assert [s.status for s in states] == ["cancelled"] * 1_000
        assert client._watcher.watching == 0


@pytest.mark.timeout(120)
async def test_following_many_logs_costs_one_subscription(
    monitored: EmbeddedNats, subjects: Subjects
) -> None:
    """``logs(follow=True)`` on 300 runs at once (what ``interlock logs --follow`` and the
    gateway's SSE stream do), and the operations' own ``follow`` on 100 of them: no
    JetStream consumer, the client's one subscription; each follower gets its own run's
    records, in order, and stops when its run ends."""
    n = 300
    async with await Client.connect(monitored.url, prefix=subjects.prefix) as client:
        await client.apply([("gated.yaml", GATED)])
        run_ids = [await client.start("gated", {}, run_id=f"f{i}") for i in range(n)]
        subs_before, consumers_before = await server_counts(monitored, client)

        async def follow(run_id: str) -> list[str]:
            return [ev.record_type(r) async for r in client.logs(run_id, follow=True)]

        async def ops_follow(run_id: str) -> list[str]:
            return [ev.record_type(r) async for r in client.ops.follow(run_id)]

        follows = [asyncio.create_task(follow(r)) for r in run_ids]
        follows += [asyncio.create_task(ops_follow(r)) for r in run_ids[:100]]
        # Every follower listens: a `logs` follower only once its first read of the whole
        # log (one of the watcher's reads too) is done. Counting runs watched is not
        # enough: runs f0-f99 are watched as soon as their `ops.follow` listens.
        watcher = client._watcher
        await wait_until(lambda: sum(map(len, watcher._listeners.values())) == n + 100)
        assert watcher.watching == n
        # While followers read their logs, each read holds a reply subscription (32 at
        # most at once); once all of them have read, the watcher's one is left.
        seen_subs: list[int] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            subs, consumers = await server_counts(monitored, client)
            assert consumers == consumers_before
            seen_subs.append(subs)
            if subs <= subs_before + 1 or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert seen_subs[-1] <= subs_before + 1, seen_subs
        assert max(seen_subs) <= subs_before + 1 + 32, seen_subs
        for run_id in run_ids:
            assert await client.cancel(run_id, "enough")
        seen = await asyncio.wait_for(asyncio.gather(*follows), TIMEOUT * 3)
        started = ev.record_type((await client.records(run_ids[0]))[0])
        for types in seen:
            assert types[0] == started
            assert types[-1] == "io.interlock.run.cancelled"
        assert client._watcher.watching == 0
