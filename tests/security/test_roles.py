"""Each party can do only its own part, enforced by NATS: the attacks of a rogue agent, a
rogue event publisher and an anonymous client are refused by the server (a permission
violation or an authentication failure) and the run logs stay as they were; the allowed
paths work with the same credentials."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.errors import Error as NatsError

from interlock.auth import jwt
from interlock.auth.push import push_account
from interlock.auth.roles import Role, inbox_prefix
from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.runtime.runs import utc_now
from interlock.transport.cloudevents import CloudEvent, encode_binary, encode_structured
from interlock.transport.connection import ConnectOptions
from interlock.transport.tasks import (
    ANSWER_HEADER,
    ANSWER_REASON_HEADER,
    ANSWER_REFUSED,
    TOKEN_HEADER,
    answer_event,
)
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

RUNS = SUBJECTS.runs_stream
TASKS = SUBJECTS.tasks_stream

# (what, publish or subscribe, subject for a given run id)
ATTACKS: list[tuple[str, str, Callable[[str], str]]] = [
    ("append to a run log", "pub", lambda run: SUBJECTS.run(run)),
    ("fire a timer", "pub", lambda run: f"il.timers.fired.{run}"),
    ("schedule a timer", "pub", lambda run: f"il.timers.schedule.{run}-t"),
    ("inject a task", "pub", lambda run: SUBJECTS.capability("echo")),
    ("write the task queue's keeper", "pub", lambda run: SUBJECTS.tasks_keeper),
    ("answer another capability", "pub", lambda run: f"il.results.held.{run}"),
    ("answer another capability by request", "pub", lambda run: SUBJECTS.answer("held", run)),
    ("purge the run logs", "pub", lambda run: f"$JS.API.STREAM.PURGE.{RUNS}"),
    ("delete the run logs", "pub", lambda run: f"$JS.API.STREAM.DELETE.{RUNS}"),
    ("change the tasks stream", "pub", lambda run: f"$JS.API.STREAM.UPDATE.{TASKS}"),
    ("create a consumer", "pub", lambda run: f"$JS.API.CONSUMER.CREATE.{RUNS}"),
    ("create a durable", "pub", lambda run: f"$JS.API.CONSUMER.DURABLE.CREATE.{TASKS}.thief"),
    ("delete a consumer", "pub", lambda run: f"$JS.API.CONSUMER.DELETE.{TASKS}.cap_echo"),
    ("take echo's tasks", "pub", lambda run: f"$JS.API.CONSUMER.MSG.NEXT.{TASKS}.cap_echo"),
    ("read a run log", "pub", lambda run: f"$JS.API.DIRECT.GET.{RUNS}.{SUBJECTS.run(run)}"),
    ("read a log message", "pub", lambda run: f"$JS.API.STREAM.MSG.GET.{RUNS}"),
    ("write a workflow", "pub", lambda run: f"$KV.{SUBJECTS.workflows_bucket}.latest.x.y"),
    (
        "change the installation's history limits",
        "pub",
        lambda run: f"$KV.{SUBJECTS.workflows_bucket}.settings.history",
    ),
    ("pause a workflow", "pub", lambda run: f"$KV.{SUBJECTS.paused_bucket}.wf.default.x"),
    ("take a concurrency slot", "pub", lambda run: f"$KV.{SUBJECTS.slots_bucket}.a.b"),
    ("fill a trigger's window", "pub", lambda run: f"$KV.{SUBJECTS.triggers_bucket}.w.a.b"),
    ("change the partition map", "pub", lambda run: f"$KV.{SUBJECTS.partitions_bucket}.map"),
    ("take a partition's lease", "pub", lambda run: f"$KV.{SUBJECTS.partitions_bucket}.owner.0"),
    ("append to another partition", "pub", lambda run: SUBJECTS.run_in(run, 1)),
    ("purge a partition's stream", "pub", lambda run: f"$JS.API.STREAM.PURGE.{RUNS}_1"),
    ("read the secrets", "pub", lambda run: "$JS.API.DIRECT.GET.KV_il_secrets.$KV.il_secrets.k"),
    ("dead-letter as the orchestrator", "pub", lambda run: "il.dlq.unknown_run"),
    # What one orchestrator hands the holder of a run's partition is decided as if read
    # from its stream: a fired timer, an answer, a signal.
    ("hand a fired timer to a run's holder", "pub", lambda run: SUBJECTS.owner(0, "timer", run)),
    ("take what is handed to a holder", "sub", lambda run: SUBJECTS.owned(0)),
    ("listen to run logs", "sub", lambda run: "il.runs.>"),
    ("listen to tasks", "sub", lambda run: "il.cap.>"),
    ("listen to answers", "sub", lambda run: "il.results.>"),
    ("take answer requests", "sub", lambda run: SUBJECTS.answers_all),
    ("listen to others' replies", "sub", lambda run: "_INBOX.>"),
    ("listen to echo's cancel notices", "sub", lambda run: "il.control.echo.*"),
    # Consumers on the buckets every party reads: a stream takes at most 1,000, and one
    # party making them would leave none for the orchestrator's watches.
    (
        "create a consumer on the AgentDefs",
        "pub",
        lambda run: "$JS.API.CONSUMER.CREATE.KV_il_agents",
    ),
    (
        "create a named consumer on the AgentDefs",
        "pub",
        lambda run: "$JS.API.CONSUMER.CREATE.KV_il_agents.hoard.$KV.il_agents.>",
    ),
    (
        "create a consumer on the workflows",
        "pub",
        lambda run: "$JS.API.CONSUMER.CREATE.KV_il_workflows",
    ),
]

ROGUES = {
    "agent": Role("agent", capabilities=("mallory",)),
    "publisher": Role("publisher", events=("acme.order.>",)),
}


async def log_bytes(secured: Secured, run_id: str) -> list[bytes]:
    return [msgspec.json.encode(r) for r in await secured.operator.read(run_id)]


async def awaited_run(secured: Secured) -> str:
    """A run of ``guarded`` whose action (capability ``held``) is awaited."""
    run_id = await secured.operator.start("guarded", {})
    async for record in secured.operator.follow(run_id, idle_timeout=30):
        if isinstance(record, ev.ActionRequested):
            return run_id
    raise AssertionError("the run never requested its action")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target(secured: Secured) -> str:
    return await awaited_run(secured)


@pytest.mark.parametrize("role", sorted(ROGUES))
@pytest.mark.parametrize(("what", "how", "subject_of"), ATTACKS, ids=[a[0] for a in ATTACKS])
async def test_refused_by_nats(
    secured: Secured,
    target: str,
    role: str,
    what: str,
    how: str,
    subject_of: Callable[[str], str],
) -> None:
    creds = secured.issued.get(f"rogue-{role}") or secured.issue(ROGUES[role], f"rogue-{role}")
    before = await log_bytes(secured, target)
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    subject = subject_of(target)
    try:
        if how == "pub":
            forged = {"run_id": target, "type": "io.interlock.run.completed", "forged": True}
            await nc.publish(subject, json.dumps(forged).encode(), reply=nc.new_inbox())
            await nc.flush()
            await refusals.wait_for("permissions violation", "publish", subject)
        else:
            await nc.subscribe(subject)
            await nc.flush()
            await refusals.wait_for("permissions violation", "subscription", subject)
    finally:
        await nc.close()
    assert await log_bytes(secured, target) == before, f"{what} changed the run log"


async def test_agents_publish_no_events_and_publishers_only_theirs(secured: Secured) -> None:
    for role, subject in (
        ("agent", "il.events.acme.order.placed"),
        ("publisher", "il.events.acme.invoice.paid"),
        ("publisher", "il.events.acme"),
    ):
        creds = secured.issued.get(f"rogue-{role}") or secured.issue(ROGUES[role], f"rogue-{role}")
        refusals = Refusals()
        nc = await plain_client(secured.url, creds, refusals)
        try:
            await nc.publish(subject, b"{}")
            await nc.flush()
            await refusals.wait_for("permissions violation", "publish", subject)
        finally:
            await nc.close()


async def test_anonymous_and_forged_credentials_are_refused(
    secured: Secured, tmp_path: Path
) -> None:
    with pytest.raises(NatsError, match=r"(?i)authorization violation"):
        await nats.connect(secured.url, allow_reconnect=False, connect_timeout=30)
    # A credential signed by an account key the operator never signed: refused too.
    rogue_account = jwt.new_key("account")
    user = jwt.new_key("user")
    token = jwt.encode(rogue_account, user.public_key, "self-made", {"type": "user"})
    creds = tmp_path / "self-made.creds"
    jwt.write_creds(creds, token, user.seed)
    with pytest.raises(NatsError, match=r"(?i)authorization violation"):
        await nats.connect(
            secured.url, user_credentials=str(creds), allow_reconnect=False, connect_timeout=30
        )


async def test_an_agent_serves_its_capability_and_a_publisher_starts_runs(secured: Secured) -> None:
    """The reference agents (their own creds) serve echo; a publisher issued while
    everything runs starts a run with its event; the run completes."""
    creds = secured.issue(Role("publisher", events=("acme.echo.*",)), "acme-echo")
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    event = CloudEvent(
        id="echo-1",
        source="https://acme.example/shop",
        type="acme.echo.requested",
        time=utc_now(),
        datacontenttype="application/json",
        data={},
    )
    try:
        headers, payload = encode_structured(event)
        await nc.jetstream().publish(SUBJECTS.event(event.type), payload, headers=headers)
    finally:
        await nc.close()
    assert not refusals.errors
    definition, _ = await secured.operator.registry.latest("echoing")
    run_id = derive_run_id(definition, event.source, event.id)
    state = await secured.operator.wait(run_id, timeout=30)
    assert state.status == "completed"
    assert state.outputs == {"said": "hello"}


async def test_a_revoked_credential_is_disconnected_and_refused(secured: Secured) -> None:
    creds = secured.issue(Role("publisher", events=("acme.revoked.>",)), "soon-revoked")
    refusals = Refusals()
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await nats.connect(
        secured.url,
        user_credentials=str(creds),
        inbox_prefix=inbox_prefix(jwt.creds_user(creds)),
        error_cb=refusals.on_error,
        closed_cb=on_closed,
        allow_reconnect=False,
        connect_timeout=5,
    )
    ack = await nc.jetstream().publish("il.events.acme.revoked.x", b"{}")
    assert ack.seq > 0
    user = jwt.creds_user(creds)
    secured.auth.keys.revoke([user])
    await push_account(ConnectOptions.resolve(secured.url), secured.auth.keys)
    # The server closes the revoked user's connection at once...
    await asyncio.wait_for(closed.wait(), 10)
    # ...and refuses it from then on.
    with pytest.raises(NatsError, match=r"(?i)revoked|authorization violation"):
        await nats.connect(
            secured.url, user_credentials=str(creds), allow_reconnect=False, connect_timeout=30
        )
    assert all(i.revoked_at is not None for i in secured.auth.keys.find(user))


OPERATOR_REFUSED = [
    "il.timers.fired.{run}",
    "il.owner.0.timer.{run}",
    "il.owner.1.event.{run}",
    "il.cap.echo",
    "il.results.held.{run}",
    "il.answer.held.{run}",
    "$KV.il_secrets.task-token-key",
    "$JS.API.DIRECT.GET.KV_il_secrets.$KV.il_secrets.task-token-key",
    "$JS.API.STREAM.MSG.GET.KV_il_secrets",
    "$JS.API.CONSUMER.CREATE.KV_il_secrets",
    "$JS.API.CONSUMER.DURABLE.CREATE.KV_il_secrets.peek",
    "$JS.API.STREAM.PURGE.KV_il_secrets",
]


@pytest.mark.parametrize("pattern", OPERATOR_REFUSED)
async def test_the_operator_writes_no_timers_tasks_or_answers_and_reads_no_secrets(
    secured: Secured, target: str, pattern: str
) -> None:
    before = await log_bytes(secured, target)
    refusals = Refusals()
    nc = await plain_client(secured.url, secured.auth.operator, refusals)
    subject = pattern.format(run=target)
    try:
        await nc.publish(subject, b"{}", reply=nc.new_inbox())
        await nc.flush()
        await refusals.wait_for("permissions violation", "publish", subject)
    finally:
        await nc.close()
    assert await log_bytes(secured, target) == before


@dataclass
class Forger:
    """An agent of ``held`` (its own connection) about to answer the target run's action
    without its task token; the run's log and the answer-token dead letters before."""

    nc: Client
    target: str
    requested: ev.ActionRequested
    log_before: list[bytes]
    letters_before: int

    def answer(self, event_id: str, token: str | None) -> tuple[dict[str, str], bytes]:
        """A task.completed answer to the requested action, with ``token`` if given."""
        answer = answer_event(
            run_id=self.target,
            action_id=self.requested.data.action_id,
            attempt=self.requested.data.attempt,
            event_id=event_id,
            source="mallory",
            type="task.completed",
            data={"forged": True},
            time=utc_now(),
        )
        headers, payload = encode_binary(answer)
        if token is not None:
            headers[TOKEN_HEADER] = token
        return headers, payload


@contextlib.asynccontextmanager
async def forger(secured: Secured, target: str) -> AsyncIterator[Forger]:
    """The agent of ``held`` connected meanwhile; NATS refuses it nothing."""
    creds = secured.issued.get("held-agent") or secured.issue(
        Role("agent", capabilities=("held",)), "held-agent"
    )
    records = await secured.operator.read(target)
    requested = next(r for r in records if isinstance(r, ev.ActionRequested))
    before = await log_bytes(secured, target)
    letters_before = len(await secured.operator.dead_letters("answer-token"))
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        yield Forger(nc, target, requested, before, letters_before)
    finally:
        await nc.close()
    assert not refusals.errors


async def test_an_agent_answering_its_capability_without_the_task_token_is_dead_lettered(
    secured: Secured, target: str
) -> None:
    """What NATS lets through (an agent of ``held`` answering on ``il.results.held.<run>``)
    the orchestrator checks: without the task's token the answer never reaches the log."""
    async with forger(secured, target) as forged:
        for n, token in enumerate((None, "AAAAforgedAAAA")):
            headers, payload = forged.answer(f"forged-{n}", token)
            ack = await forged.nc.jetstream().publish(
                SUBJECTS.result("held", target), payload, headers=headers
            )
            assert ack.seq > 0  # NATS took it: the subject is this agent's own
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while len(await secured.operator.dead_letters("answer-token")) < forged.letters_before + 2:
        assert loop.time() < deadline, "the forged answers were not dead-lettered"
        await asyncio.sleep(0.1)
    assert await log_bytes(secured, target) == forged.log_before

    # The operator cannot redrive it (it may not publish answers): refused before
    # anything is sent, saying why (the server's permission refusal came as a timeout).
    from interlock.client import NotRedrivable

    letter = (await secured.operator.dead_letters("answer-token"))[-1]
    assert letter.subject == SUBJECTS.result("held", target)
    with pytest.raises(NotRedrivable, match="answers come from agents"):
        await secured.operator.redrive(letter.seq)
    assert (await secured.operator.dead_letter(letter.seq)).reason == "answer-token"


async def test_an_agent_requesting_an_answer_without_the_task_token_is_told_it_is_refused(
    secured: Secured, target: str
) -> None:
    """The same answer by request on ``il.answer.held.<run>``: NATS lets the agent of
    ``held`` send it (the reply comes to its own inbox), the orchestrator refuses it, says
    so in the reply once it is dead-lettered, and the log is unchanged."""
    async with forger(secured, target) as forged:
        headers, payload = forged.answer("forged-by-request", "AAAAforgedAAAA")
        reply = await forged.nc.request(
            SUBJECTS.answer("held", target), payload, headers=headers, timeout=15
        )
    assert reply.headers is not None
    assert reply.headers[ANSWER_HEADER] == ANSWER_REFUSED
    assert reply.headers[ANSWER_REASON_HEADER] == "answer-token"
    # Replied to once dead-lettered.
    letters = await secured.operator.dead_letters("answer-token")
    assert len(letters) == forged.letters_before + 1
    assert await log_bytes(secured, target) == forged.log_before


async def test_the_operators_client_waits_through_its_one_subscription(secured: Secured) -> None:
    """``Client.result(wait=True)`` on operator credentials: the run-log subscription its
    waits share is allowed (refused, the waits would fall back to reading each log every
    second)."""
    from interlock import Client

    client = Client(secured.operator.nc, SUBJECTS)
    run_id = await awaited_run(secured)
    waiting = asyncio.ensure_future(client.result(run_id, wait=True, timeout=60))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not client._watcher.watching:  # the wait has read the log, found the run going on
        assert loop.time() < deadline, "the wait never subscribed to the run log"
        await asyncio.sleep(0.01)
    assert not waiting.done()
    await client.cancel(run_id, "no longer needed")
    result = await waiting
    assert (result.status, result.reason) == ("cancelled", "no longer needed")
    assert client._watcher.hinted


PLANTED = [
    ("a run log", lambda run: SUBJECTS.run(run)),
    ("a run's own events", lambda run: f"il.events.@run.{run}.approve"),
    ("a workflow definition", lambda run: f"$KV.{SUBJECTS.workflows_bucket}.latest.x.y"),
    ("an event", lambda run: SUBJECTS.event("acme.order.placed")),
]


@pytest.mark.parametrize(("where", "subject_of"), PLANTED, ids=[p[0] for p in PLANTED])
async def test_an_agents_own_dead_letter_is_not_redriven_by_the_operator(
    secured: Secured, target: str, where: str, subject_of: Callable[[str], str]
) -> None:
    """An agent writes its own dead letters (``il.dlq.agent.<capability>.*``), headers and
    all: one naming another subject would have the operator, who redrives it, publish the
    agent's bytes where the agent may not (a run's log, its events, a definition). A letter
    an agent wrote is not redriven; nothing is published and the letter stays."""
    from interlock.client import NotRedrivable

    creds = secured.issued.get("held-agent") or secured.issue(
        Role("agent", capabilities=("held",)), "held-agent"
    )
    before = await log_bytes(secured, target)
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        ack = await nc.jetstream().publish(
            SUBJECTS.agent_dead_letter("held", "bad_input"),
            b'[{"planted": true}]',
            headers={
                "Interlock-Dead-Letter-Reason": "bad_input",
                "Interlock-Dead-Letter-Subject": subject_of(target),
                "Content-Type": "application/cloudevents-batch+json",
            },
        )
    finally:
        await nc.close()
    assert not refusals.errors  # the agent's own dead-letter subject
    with pytest.raises(NotRedrivable, match="an agent wrote it"):
        await secured.operator.redrive(ack.seq)
    letter = await secured.operator.dead_letter(ack.seq)  # still there
    assert letter.subject == subject_of(target)
    assert await log_bytes(secured, target) == before


JUNK_HEARTBEATS = [
    b"not json",
    b"[1, 2]",
    b'{"name": "m", "instance": "1", "capabilities": 5}',
    b'{"name": "m", "instance": "2", "capabilities": [{"a": 1}, "held"]}',
    b'{"name": "m", "instance": "3", "capabilities": ["held", "echo", "review"]}',
    b"[" * 30_000 + b"]" * 30_000,  # nested far past any parser's depth, under 64 KiB
]


async def test_an_agents_junk_heartbeats_hide_no_worker_and_fail_no_listing(
    secured: Secured,
) -> None:
    """An agent writes its own heartbeats, any bytes under its capabilities' keys: values
    that are not JSON objects are left out of the listings (the operator's, the HTTP
    gateway's, the orchestrator's gauges), fields of the wrong type read as none, and a
    heartbeat counts only for its key's capability, whatever others it names."""
    from interlock.client import Client as Facade
    from interlock.core.ids import capability_token
    from interlock.runtime.buckets import live_workers
    from interlock.runtime.cluster_metrics import ClusterMetrics
    from interlock.transport.kvread import bucket_values

    listed_before = await secured.operator.agents()
    creds = secured.issued.get("held-agent") or secured.issue(
        Role("agent", capabilities=("held",)), "held-agent"
    )
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        key = f"$KV.{SUBJECTS.workers_bucket}.{capability_token('held')}"
        for n, junk in enumerate(JUNK_HEARTBEATS):
            await nc.jetstream().publish(f"{key}.junk{n}", junk)
    finally:
        await nc.close()
    assert not refusals.errors  # its own keys: NATS lets it
    listed = await secured.operator.agents()
    assert listed["workers"][: len(listed_before["workers"])] == listed_before["workers"]
    kv = await secured.operator.js.key_value(SUBJECTS.workers_bucket)
    heartbeats = await bucket_values(kv)
    assert len(heartbeats) >= len(JUNK_HEARTBEATS)
    workers = live_workers(heartbeats)
    by_instance = {w.get("instance"): w for w in workers if w.get("name") == "m"}
    assert by_instance["1"]["capabilities"] == []
    assert by_instance["2"]["capabilities"] == ["held"]
    # Its keys are held's: it is no worker of the capabilities it names besides.
    assert by_instance["3"]["capabilities"] == ["held"]
    assert all(isinstance(w, dict) for w in workers)
    # The orchestrator's gauges, which read the bucket a batch at a time, count the same.
    metrics = ClusterMetrics(secured.operator.js, SUBJECTS, registry=None)
    await metrics.poll()
    [family] = [f for f in metrics.collect() if f.name == "interlock_capability_workers"]
    gauge = {s.labels["capability"]: s.value for s in family.samples}
    for capability in ("held", "echo"):
        assert gauge.get(capability, 0) == sum(capability in w["capabilities"] for w in workers)
    facade = Facade(secured.operator.nc, secured.operator.subjects)
    views = await facade.agents()  # what `interlock agents` and GET /agents show
    assert any(w.instance == "2" for v in views for w in v.workers)


async def test_an_agents_ack_reaches_no_task_of_another_capability(
    secured: Secured, target: str
) -> None:
    """The task queue is a work queue: an acknowledgement removes the task it names. An
    agent may acknowledge through its own capability's consumer only, but it writes the
    acknowledgement's subject, stream sequence and all: one naming the sequence of another
    capability's queued task (``held``'s, a guess among the sequences around its own
    tasks') removes nothing of it, whatever the agent sends (ack, term, nak)."""
    creds = secured.issued.get("echo-team") or secured.issue(
        Role("agent", capabilities=("echo",)), "echo-team"
    )
    queued = await _queued(secured, SUBJECTS.capability("held"))
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        for body in (b"+ACK", b"+TERM", b"-NAK"):
            for seq in range(max(1, queued.seq - 2), queued.seq + 3):
                await nc.publish(f"$JS.ACK.{TASKS}.cap_echo.1.{seq}.{seq}.1.0", body)
        await nc.flush()
    finally:
        await nc.close()
    assert not refusals.errors
    # Nothing says when the consumer has handled them: the task is looked for during a
    # second after (an acknowledgement its consumer takes removes a task at once).
    for _ in range(10):
        still = await secured.operator.js.get_msg(TASKS, queued.seq)
        assert still.subject == SUBJECTS.capability("held")
        await asyncio.sleep(0.1)


async def _queued(secured: Secured, subject: str) -> Any:
    """The newest task queued on ``subject``, once one is (dispatched after its record)."""
    from nats.js.errors import NotFoundError

    from support.runtime import eventually

    async def probe() -> Any:
        with contextlib.suppress(NotFoundError):
            return await secured.operator.js.get_last_msg(TASKS, subject)
        return None

    return await eventually(probe, what=f"a task queued on {subject}")
