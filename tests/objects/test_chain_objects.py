"""Payloads kept by reference across a chain of runs continued as new, on a real
nats-server: a run whose inputs, context and answer are over the object threshold
continues as new; the new run reads them in a guard and a template and completes; no
log of the chain holds a payload over the threshold nor a reference to another run's
object; ``result`` and ``describe`` give the values whole; deleting a link while the
chain goes on deletes nothing, and deleting the ended chain leaves no object behind."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import msgspec
import pytest
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

import interlock
from interlock import Client
from interlock.core import events as ev
from interlock.core.objects import MARKER, is_marker
from interlock.transport.objects import stream_of
from interlock.transport.subjects import Subjects
from support.objects import PILES_AGENT, SIZE, pile_worker
from support.runtime import TIMEOUT, running_stack, serving

MANIFESTS = [
    PILES_AGENT,
    textwrap.dedent(
        """\
        apiVersion: interlock.io/v1
        kind: Workflow
        metadata: {name: carried}
        spec:
          inputs:
            blob: {type: string, required: true}
            round: {type: integer, default: 1}
          initial_state: fetch
          states:
            fetch:
              actions: [{capability: pile, input: {n: 1}}]
              on:
                - {event: task.completed, goto: waiting, set: {answer: "{{ result.blob }}"}}
            waiting:
              on:
                - event: renew
                  goto: check
                  continue_as_new:
                    inputs: {blob: "{{ inputs.blob }}", round: "{{ inputs.round + 1 }}"}
            check:
              on:
                - event: finish
                  guard: >-
                    inputs.round == 2 && size(inputs.blob) == 300 * 1024
                    && size(context.answer) == 300 * 1024 && context.answer.startsWith("p")
                  goto: done
                - {event: finish, goto: wrong}
            done:
              type: terminal
              outputs:
                blob: "{{ inputs.blob }}"
                answer: "{{ context.answer }}"
                round: "{{ inputs.round }}"
            wrong: {type: terminal}
        """
    ),
]


def _refs(value: Any) -> list[dict[str, Any]]:
    """Every reference anywhere in ``value`` (a record's data, as logged)."""
    if is_marker(value):
        return [value[MARKER]]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []


async def _objects(client: Client, bucket: str) -> set[str]:
    """The names of the objects in ``bucket``."""
    try:
        listed = await ObjectStore(bucket, stream_of(bucket), client.ops.js).list()
    except NotFoundError:
        return set()
    return {o.name for o in listed}


async def test_values_by_reference_go_on_in_a_chain_and_go_with_it(
    nats_url: str, subjects: Subjects
) -> None:
    blob = "i" * SIZE
    async with (
        running_stack(nats_url, subjects, MANIFESTS, worker=False) as stack,
        await Client.connect(nats_url, prefix=subjects.prefix) as client,
    ):
        async with serving(nats_url, subjects, pile_worker()):
            first = await client.start("carried", {"blob": blob})
            for _ in range(500):
                if (await client.describe(first)).state == "waiting":
                    break
                await asyncio.sleep(0.02)
        told = await client.signal(first, "renew", wait=TIMEOUT)
        assert (told.outcome, told.after) == ("moved", "continued"), told
        second = told.continued_to
        assert second is not None
        for _ in range(500):
            if (await client.result(first)).status == "running":
                break
            await asyncio.sleep(0.02)

        # Each log holds references only to its own run's objects, no payload over the
        # threshold, and the new run's start names its own copies.
        for run_id in (first, second):
            for record in await stack.records(run_id):
                data = msgspec.to_builtins(record.data)
                assert len(msgspec.json.encode(data)) < SIZE, (run_id, type(record))
                for ref in _refs(data):
                    assert ref["name"].startswith(f"{run_id}."), (run_id, type(record), ref)
        started = (await stack.records(second))[0]
        assert isinstance(started, ev.RunStarted)
        assert is_marker(started.data.context["answer"])

        # Deleting the first run while its chain goes on deletes nothing.
        bucket = subjects.objects_bucket
        before = await _objects(client, bucket)
        assert any(n.startswith(f"{first}.") for n in before), before
        assert any(n.startswith(f"{second}.") for n in before), before
        with pytest.raises(interlock.RunNotEnded):
            await client.delete_run(first)
        assert await _objects(client, bucket) == before

        # The new run reads the values in its guard and templates, and completes.
        await client.signal(first, "finish", wait=TIMEOUT)
        result = await client.result(first, wait=True, timeout=TIMEOUT)
        assert (result.status, result.run_id) == ("completed", second)
        assert result.chain == [first, second]
        assert result.outputs == {"blob": blob, "answer": "p" * SIZE, "round": 2}
        described = await client.describe(second)
        assert described.inputs == {"blob": blob, "round": 2}
        assert described.context["answer"] == "p" * SIZE
        assert described.outputs == result.outputs
        old = await client.describe(first)
        assert old.inputs == {"blob": blob, "round": 1}
        assert old.context["answer"] == "p" * SIZE

        # Deleting the ended chain deletes every object of every run of it.
        deleted = await client.delete_run(first)
        assert deleted.chain == (first, second)
        assert await _objects(client, bucket) == set()
