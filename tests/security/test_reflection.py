"""A party's reply subject cannot reach a protected subject: agents and publishers are
users of accounts of their own, issued with ``interlock creds issue``, and whatever reply
subject they name lives in their account, where only their imports lead anywhere. Every
way a server-side component answers is tried: JetStream publish acknowledgements (events,
answers on the results stream, heartbeats, an agent's dead letters), JetStream API answers
(a consumer's info, a pull request, a bucket read), and the orchestrator's reply to an
answer by request. Afterwards each target is as it was.

The same credentials' legitimate work (the run of a capability served by a worker of the
SDK, ``interlock emit``) is tried in test_roles, test_creds_cli and here."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client

from interlock.core import events as ev
from support.auth import SUBJECTS, Refusals, Secured, plain_client, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

INTERLOCK = str(Path(sys.executable).with_name("interlock"))
RUNS, EVENTS, TASKS = SUBJECTS.runs_stream, SUBJECTS.events_stream, SUBJECTS.tasks_stream
BUCKETS = ("KV_il_workflows", "KV_il_agents", "KV_il_secrets")

# A capability the rogue agent's credential serves, and one it does not (``held``, served
# by nobody: its task queue keeps what lands there).
REFL = """\
apiVersion: interlock.io/v1
kind: AgentDef
metadata:
  name: refl
spec:
  capabilities:
    - name: refl
      input_schema: {type: object}
      output_schema: {type: object}
"""


def targets(run_id: str) -> dict[str, str]:
    """Protected subjects a reply could be aimed at."""
    return {
        "purge the run logs": f"$JS.API.STREAM.PURGE.{RUNS}",
        "delete the events stream": f"$JS.API.STREAM.DELETE.{EVENTS}",
        "append to a run log": SUBJECTS.run(run_id),
        "write a workflow": "$KV.il_workflows.reflected",
        "write an AgentDef": "$KV.il_agents.reflected",
        "overwrite the task-token key": "$KV.il_secrets.task-token-key",
        "inject a task of another capability": SUBJECTS.capability("held"),
        "cancel another party's task": f"il.control.held.{run_id}",
    }


async def cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        INTERLOCK,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def issued(secured: Secured, name: str, *flags: str) -> Path:
    """A credential made as a user makes it: ``interlock creds issue`` (which pushes its
    account to the running server)."""
    if name in secured.issued:
        return secured.issued[name]
    path = secured.data / f"{name}.creds"
    code, out = await cli(
        "creds", "issue", *flags, "--name", name, "-o", str(path),
        "--keys", str(secured.auth.keys.dir), "--server", secured.url,
    )  # fmt: skip
    assert code == 0, out
    assert "account A" in out  # an account of its own
    secured.issued[name] = path
    return path


class Snapshot:
    """What the targets hold: each stream's state, the run's log, ``held``'s tasks."""

    def __init__(self, streams: dict[str, tuple[int, int]], log: list[bytes], held: int) -> None:
        self.streams, self.log, self.held = streams, log, held

    @classmethod
    async def take(cls, secured: Secured, run_id: str) -> Snapshot:
        js = secured.operator.js
        streams = {}
        for name in (RUNS, *BUCKETS):
            state = (await js.stream_info(name)).state
            streams[name] = (state.messages, state.last_seq)
        held = await js.stream_info(TASKS, subjects_filter=SUBJECTS.capability("held"))
        count = sum((held.state.subjects or {}).values())
        records = await secured.operator.read(run_id)
        return cls(streams, [r.id.encode() for r in records], count)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run_id(secured: Secured) -> str:
    """A run of ``guarded`` whose action (capability ``held``) is awaited."""
    applied = await secured.operator.apply([("<refl>", REFL)])
    applied.compiled.raise_for_errors()
    run = await secured.operator.start("guarded", {})
    async for record in secured.operator.follow(run, idle_timeout=30):
        if isinstance(record, ev.ActionRequested):
            return run
    raise AssertionError("the run never requested its action")


async def listening_party(secured: Secured, run_id: str) -> tuple[Client, list[str]]:
    """The agent of ``held`` (another credential), hearing its cancel notices."""
    creds = await issued(secured, "held-party", "agent", "--capability", "held")
    heard: list[str] = []

    async def note(msg: nats.aio.msg.Msg) -> None:
        heard.append(msg.subject)

    nc = await plain_client(secured.url, creds, Refusals())
    await nc.subscribe("il.control.held.*", cb=note)
    await nc.flush()
    return nc, heard


async def unchanged(secured: Secured, run_id: str, before: Snapshot, heard: list[str]) -> None:
    await asyncio.sleep(1.0)  # every reply the server would write is written by now
    after = await Snapshot.take(secured, run_id)
    assert after.streams == before.streams
    assert after.log == before.log
    assert after.held == before.held
    assert heard == []
    info = await secured.operator.js.stream_info(EVENTS)  # not deleted
    assert info.config.name == EVENTS


async def test_a_publishers_reply_subjects_reach_nothing(secured: Secured, run_id: str) -> None:
    creds = await issued(secured, "reflecting-publisher", "publisher", "--events", "acme.>")
    other, heard = await listening_party(secured, run_id)
    before = await Snapshot.take(secured, run_id)
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        for n, reply in enumerate(targets(run_id).values()):
            # An event of its own types, stored with a JetStream ack sent to ``reply``.
            headers = {"Nats-Msg-Id": f"reflect-{n}"}
            await nc.publish("il.events.acme.reflected", b"{}", reply=reply, headers=headers)
        await nc.flush()
        await unchanged(secured, run_id, before, heard)
        # Its own work goes on: an event with an ack to its inbox.
        ack = await nc.jetstream().publish("il.events.acme.reflected", b"{}")
        assert ack.stream == EVENTS
    finally:
        await nc.close()
        await other.close()
    assert not refusals.errors


async def test_an_agents_reply_subjects_reach_nothing(secured: Secured, run_id: str) -> None:
    creds = await issued(secured, "reflecting-agent", "agent", "--capability", "refl")
    other, heard = await listening_party(secured, run_id)
    before = await Snapshot.take(secured, run_id)
    api = SUBJECTS.party_js_api
    pull = json.dumps({"batch": 1, "expires": 500_000_000}).encode()
    # Everything it may send that something answers: JetStream acks (results, heartbeats,
    # its dead letters), JetStream API answers (a consumer's info, a pull request, bucket
    # reads), the orchestrator's reply to an answer.
    requests = [
        (f"il.results.refl.{run_id}", b"{}"),
        ("$KV.il_workers.refl.rogue", b"{}"),
        ("il.dlq.agent.refl.rogue", b"{}"),
        (f"il.answer.refl.{run_id}", b"{}"),
        (f"{api}.CONSUMER.INFO.{TASKS}.cap_refl", b""),
        (f"{api}.CONSUMER.MSG.NEXT.{TASKS}.cap_refl", pull),
        (f"{api}.STREAM.INFO.KV_il_agents", b""),
        (f"{api}.DIRECT.GET.KV_il_agents", b'{"last_by_subj": "$KV.il_agents.refl"}'),
    ]
    refusals = Refusals()
    nc = await plain_client(secured.url, creds, refusals)
    try:
        for reply in targets(run_id).values():
            for subject, payload in requests:
                await nc.publish(subject, payload, reply=reply)
        await nc.flush()
        await unchanged(secured, run_id, before, heard)
        # Its own work goes on: its consumer's info, on its own inbox.
        info = await nc.request(f"{api}.CONSUMER.INFO.{TASKS}.cap_refl", b"", timeout=5)
        assert json.loads(info.data)["name"] == "cap_refl"
    finally:
        await nc.close()
        await other.close()
    assert not refusals.errors


async def test_an_agent_cannot_reflect_onto_another_agents_subjects(
    secured: Secured, run_id: str
) -> None:
    """Two agents in one account could reflect onto each other (the ack of one's heartbeat
    aimed at the other's cancel notices): each credential has an account of its own."""
    creds = await issued(secured, "reflecting-agent", "agent", "--capability", "refl")
    other, heard = await listening_party(secured, run_id)
    nc = await plain_client(secured.url, creds, Refusals())
    try:
        await nc.publish("$KV.il_workers.refl.rogue", b"{}", reply=f"il.control.held.{run_id}")
        await nc.publish("$KV.il_workers.refl.rogue", b"{}", reply="$KV.il_workers.held.rogue")
        await nc.flush()
        await asyncio.sleep(1.0)
        assert heard == []
        workers = await secured.operator.js.key_value("il_workers")
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await workers.get("held.rogue")
    finally:
        await nc.close()
        await other.close()
