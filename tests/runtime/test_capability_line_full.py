"""A capability limit's line of requests is bounded (``max_waiting``), on a real
nats-server, as a workflow's author sees it: a request that finds its line full is not
put in it; its attempt fails (``platform_error``, code ``capacity_line_full``, the limit
and key named), and the run's ``catch`` takes it, or the run fails as on any failure; the
line goes on. Both for a concurrency limit and for a rate."""

from __future__ import annotations

import asyncio
import json

from interlock.core import events as ev
from interlock.transport.subjects import Subjects
from support.concurrency import Gates, gate_worker
from support.runtime import Stack, cli_env, eventually, run_cli, running_stack, yaml

AGENT = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: gateagent
    spec:
      capabilities:
        - name: gate
          timeout_seconds: 60
          concurrency: {limit: 1, key: input.customer, max_waiting: 1}
        - name: metered
          rate: {limit: 1, per: 1h, max_waiting: 1}
    """
)


def asking(name: str, capability: str, catch: str = "") -> str:
    """A workflow of one ``capability`` action for ``inputs.customer``; with ``catch``,
    a ``capacity_line_full`` failure goes to the terminal state ``busy``."""
    return (
        "apiVersion: interlock.io/v1\nkind: Workflow\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        "  inputs:\n"
        "    customer: {type: string, required: true}\n"
        "    n: {type: integer, default: 0}\n"
        "  initial_state: work\n"
        "  states:\n"
        "    work:\n"
        "      actions:\n"
        f"        - capability: {capability}\n"
        '          input: {customer: "{{ inputs.customer }}", n: "{{ inputs.n }}"}\n'
        "      on: [{event: task.completed, goto: done}]\n"
        f"{catch}"
        "    done: {type: terminal}\n"
    )


CATCH = (
    "      catch:\n"
    "        - errors: [platform_error]\n"
    "          codes: [capacity_line_full]\n"
    "          set: {why: '{{ result.error.message }}'}\n"
    "          goto: busy\n"
    "    busy: {type: terminal, outputs: {why: '{{ context.why }}'}}\n"
)


async def _queued(stack: Stack, run_id: str) -> bool:
    records = await stack.records(run_id)
    return any(isinstance(r, ev.ActionQueued) for r in records)


async def test_a_request_past_a_full_line_fails_its_attempt_and_the_line_goes_on(
    nats_url: str, subjects: Subjects
) -> None:
    gates = Gates()
    manifests = [
        AGENT,
        asking("plain", "gate"),
        asking("careful", "gate", CATCH),
        asking("metering", "metered", CATCH),
    ]
    async with (
        running_stack(nats_url, subjects, manifests, worker=False) as stack,
        gate_worker(nats_url, subjects, gates),
    ):
        client = stack.client
        acme = {"customer": "acme"}
        holder = await client.start("plain", {**acme, "n": 0}, run_id="line-holder")
        await eventually(lambda: _has_started(gates, 1), what="the first request at work")
        waiter = await client.start("plain", {**acme, "n": 1}, run_id="line-waiter")
        await eventually(lambda: _queued(stack, waiter), what="the second request in line")

        # The line holds one: the third is turned away, its run's catch takes it.
        caught = await client.start("careful", {**acme, "n": 2}, run_id="line-caught")
        result = await stack.wait(caught)
        assert (result.status, result.state) == ("completed", "busy"), result
        why = "the line of cap:gate is full for key 'acme': 1 request waits, at most 1 may"
        assert result.outputs == {"why": why}
        records = await stack.records(caught)
        (failed,) = [r for r in records if isinstance(r, ev.ActionFailed)]
        error = failed.data.error
        assert (error.error_class, error.code, error.retryable) == (
            "platform_error",
            "capacity_line_full",
            True,
        )
        assert not any(isinstance(r, ev.ActionAdmitted | ev.ActionQueued) for r in records)
        # Without a catch the run fails with it, as the CLI shows.
        failing = await client.start("plain", {**acme, "n": 3}, run_id="line-failing")
        assert (await stack.wait(failing)).status == "failed"
        env = cli_env(nats_url, subjects.prefix)
        shown = await asyncio.to_thread(run_cli, "result", failing, "--json", env=env)
        assert shown.returncode == 1, shown
        assert json.loads(shown.stdout)["error"] == {
            "class": "platform_error",
            "message": why,
            "code": "capacity_line_full",
        }
        # Another key has a line of its own.
        beta = await client.start("plain", {"customer": "beta", "n": 100}, run_id="line-beta")
        await eventually(lambda: _has_started(gates, 2), what="beta's request at work")
        # The line goes on: the holder's end admits the one waiting, whose place frees.
        gates.gate(0).set()
        gates.gate(1).set()
        gates.gate(100).set()
        for run in (holder, waiter, beta):
            assert (await stack.wait(run)).status == "completed"
        assert sorted(gates.started) == [0, 1, 100]

        # A rate's line: one token an hour; the first goes, the second waits, the third
        # is turned away.
        first = await client.start("metering", acme, run_id="rate-first")
        await eventually(
            lambda: _has(stack, first, ev.ActionAdmitted), what="the first request sent"
        )
        second = await client.start("metering", acme, run_id="rate-second")
        await eventually(lambda: _queued(stack, second), what="the second request in line")
        third = await client.start("metering", acme, run_id="rate-third")
        result = await stack.wait(third)
        assert (result.status, result.state) == ("completed", "busy"), result
        assert result.outputs == {
            "why": "the line of cap:metered:rate is full for key '': 1 request waits, at most 1 may"
        }
        for run in (first, second):
            await client.cancel(run, "done with it")


async def _has_started(gates: Gates, count: int) -> bool:
    return len(gates.started) >= count


async def _has(stack: Stack, run_id: str, kind: type[ev.Record]) -> bool:
    records = await stack.records(run_id)
    return any(isinstance(r, kind) for r in records)
