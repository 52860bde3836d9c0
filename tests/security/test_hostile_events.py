"""Hostile CloudEvents at ingress: nested 10,000 levels deep (both content modes), larger
than an event may be, or carrying ``data_base64``, are dead-lettered at once (one delivery,
no retries) with their reason; ``interlock dead-letters list --json`` lists them all; an
unrelated run completes meanwhile."""

from __future__ import annotations

import asyncio
import base64
import json

from interlock.core.compiler import compile_workflow_text
from interlock.core.engine import derive_run_id
from interlock.transport.subjects import Subjects
from support.hostile import (
    ECHO_FLOW,
    PINGED,
    DeadLetters,
    bystander_completes,
    cli_env,
    run_cli,
    running_stack,
)

DEPTH = 10_000


def _structured(event_id: str, **fields: object) -> tuple[dict[str, str], bytes]:
    body = {"specversion": "1.0", "id": event_id, "source": "hostile", "type": "com.hostile"}
    body.update(fields)
    return {"Content-Type": "application/cloudevents+json"}, json.dumps(body).encode()


def _deep_structured() -> tuple[dict[str, str], bytes]:
    head, _ = _structured("deep-structured")
    body = (
        b'{"specversion":"1.0","id":"deep-structured","source":"hostile",'
        b'"type":"com.hostile","data":' + b"[" * DEPTH + b"]" * DEPTH + b"}"
    )
    return head, body


def _deep_binary() -> tuple[dict[str, str], bytes]:
    headers = {
        "ce-specversion": "1.0",
        "ce-id": "deep-binary",
        "ce-source": "hostile",
        "ce-type": "com.hostile",
        "Content-Type": "application/json",
    }
    return headers, b'{"a":' * DEPTH + b"1" + b"}" * DEPTH


def _oversized(size: int) -> tuple[dict[str, str], bytes]:
    return _structured("oversized", data={"blob": "x" * size})


def _base64_letter() -> tuple[dict[str, str], bytes]:
    # Valid data_base64 (not UTF-8 once decoded), but no ``type``: refused, and its letter
    # holds a payload that is JSON with binary inside.
    headers, _ = _structured("b64")
    body = {
        "specversion": "1.0",
        "id": "b64",
        "source": "hostile",
        "data_base64": base64.b64encode(bytes(range(256))).decode(),
    }
    return headers, json.dumps(body).encode()


def _binary_junk() -> tuple[dict[str, str], bytes]:
    """A payload that is neither JSON nor UTF-8 (its letter is listed as data_base64)."""
    return {"Content-Type": "application/cloudevents+json"}, bytes(range(256)) * 4


async def test_hostile_events_are_dead_lettered_at_once(nats_url: str, subjects: Subjects) -> None:
    async with running_stack(nats_url, subjects, [ECHO_FLOW]) as stack:
        quarter = stack.client.nc.max_payload // 4
        sent = {
            "deep-structured": _deep_structured(),
            "deep-binary": _deep_binary(),
            "oversized": _oversized(quarter + 1024),
            "b64": _base64_letter(),
            "junk": _binary_junk(),
        }
        expected = {
            "deep-structured": "too-deep",
            "deep-binary": "too-deep",
            "oversized": "too-large",
            "b64": "missing-attribute",
            "junk": "bad-json",
        }
        async with DeadLetters(stack.js, subjects) as letters:
            for headers, payload in sent.values():
                await stack.js.publish(subjects.event("com.hostile"), payload, headers=headers)
            got = [await letters.next() for _ in sent]
            # Meanwhile, and after: an unrelated run goes through.
            await bystander_completes(stack)
        reasons = sorted(m.headers.get("Interlock-Dead-Letter-Reason", "") for m in got)
        assert reasons == sorted(expected.values())
        # At once, never retried: the old path retried ten times over minutes before
        # dead-lettering (each retry a redelivery of the ingress consumer).
        assert stack.orchestrator.counters["dead_lettered:processing-failed"] == 0
        info = await stack.js.consumer_info(subjects.events_stream, "ingress")
        assert info.num_redelivered == 0

        env = cli_env(nats_url, subjects.prefix)
        listed = await asyncio.to_thread(run_cli, "dead-letters", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert "Traceback" not in listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert sorted(r["reason"] for r in rows) == sorted(expected.values())
        junk = next(r for r in rows if r["reason"] == "bad-json")
        assert base64.b64decode(junk["data_base64"]) == sent["junk"][1]
        deep = next(r for r in rows if r["reason"] == "too-deep")
        assert isinstance(deep["data"], str)  # kept as text, not decoded into a stack overflow
        table = await asyncio.to_thread(run_cli, "dead-letters", "list", env=env)
        assert table.returncode == 0, table.stderr
        for seq in (r["seq"] for r in rows):
            shown = await asyncio.to_thread(run_cli, "dead-letters", "show", str(seq), env=env)
            assert shown.returncode == 0, shown.stderr


async def test_events_with_a_status_header_are_events_not_server_statuses(
    nats_url: str, subjects: Subjects
) -> None:
    """A server's answer to a pull request carries its status on the header block's first
    line, which nats-py reads as a ``Status`` header; a publisher may send a ``Status``
    header of its own. Such an event is handled as any other (a valid one starts its run,
    junk is dead-lettered at once), never taken for "no messages" or "consumer deleted"
    and left to come again after every ack wait."""
    async with running_stack(nats_url, subjects, [ECHO_FLOW, PINGED]) as stack:
        valid = {
            "ce-specversion": "1.0",
            "ce-id": "status-404",
            "ce-source": "hostile",
            "ce-type": "acme.ping",
            "Status": "404",
            "Description": "No Messages",
        }
        junk = [
            {"Content-Type": "application/cloudevents+json", "Status": status, "Description": why}
            for status, why in (("409", "Consumer Deleted"), ("404", "No Messages"))
        ]
        async with DeadLetters(stack.js, subjects) as letters:
            for headers in junk:
                await stack.js.publish(subjects.event("acme.ping"), b"", headers=headers)
            await stack.js.publish(subjects.event("acme.ping"), b"", headers=valid)
            got = [await letters.next() for _ in junk]
            run_id = derive_run_id(compile_workflow_text(PINGED), "hostile", "status-404")
            state = await stack.wait(run_id)
            assert state.status == "completed", state
            await bystander_completes(stack)
        assert [(m.headers or {}).get("Interlock-Dead-Letter-Reason") for m in got] == [
            "bad-json",
            "bad-json",
        ]
        info = await stack.js.consumer_info(subjects.events_stream, "ingress")
        assert info.num_redelivered == 0
        assert info.num_ack_pending == 0

        env = cli_env(nats_url, subjects.prefix)
        listed = await asyncio.to_thread(run_cli, "dead-letters", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["reason"], r["headers"].get("Status")) for r in rows] == [
            ("bad-json", "409"),
            ("bad-json", "404"),
        ]
        for row in rows:  # each shown by its sequence, the publisher's Status header and all
            shown = await asyncio.to_thread(
                run_cli, "dead-letters", "show", str(row["seq"]), "--json", env=env
            )
            assert shown.returncode == 0, shown.stderr


async def test_a_letter_that_kept_only_the_start_of_its_message_is_not_redriven(
    nats_url: str, subjects: Subjects
) -> None:
    """A message too large for a letter keeps its first 16 KiB there: redriving that would
    publish a message the sender never sent and drop the letter, so it is refused (exit 1,
    the letter left). A sender's own ``Interlock-Dead-Letter-`` headers do not make it into
    its letter: it cannot make the letter look truncated, nor name another subject."""
    async with running_stack(nats_url, subjects, [ECHO_FLOW]) as stack:
        # Fits in a message, not in a letter beside the letter's headers.
        headers, big = _structured(
            "huge", data={"blob": "x" * (stack.client.nc.max_payload - 4096)}
        )
        spoofed = {
            "Content-Type": "application/cloudevents+json",
            "Interlock-Dead-Letter-Truncated": "5",
            "interlock-dead-letter-subject": subjects.event("com.elsewhere"),
        }
        async with DeadLetters(stack.js, subjects) as letters:
            await stack.js.publish(subjects.event("com.hostile"), big, headers=headers)
            await stack.js.publish(subjects.event("com.hostile"), b"{junk", headers=spoofed)
            got = {}
            for _ in range(2):
                letter = await letters.next()
                got[letter.headers["Interlock-Dead-Letter-Reason"]] = letter
        truncated, junk = got["too-large"], got["bad-json"]
        assert truncated.headers["Interlock-Dead-Letter-Truncated"] == str(len(big))
        assert len(truncated.data) == 16 * 1024
        assert "Interlock-Dead-Letter-Truncated" not in junk.headers
        assert "interlock-dead-letter-subject" not in junk.headers
        assert junk.headers["Interlock-Dead-Letter-Subject"] == subjects.event("com.hostile")

        env = cli_env(nats_url, subjects.prefix)
        listed = await asyncio.to_thread(run_cli, "dead-letters", "list", "--json", env=env)
        seqs = {
            json.loads(line)["reason"]: json.loads(line)["seq"]
            for line in listed.stdout.splitlines()
        }
        refused = await asyncio.to_thread(
            run_cli, "dead-letters", "redrive", str(seqs["too-large"]), env=env
        )
        assert refused.returncode == 1, refused
        assert (
            f"dead letter {seqs['too-large']} cannot be redriven: it keeps only the first "
            f"16,384 bytes of a {len(big):,}-byte message"
        ) in refused.stderr
        kept = await asyncio.to_thread(
            run_cli, "dead-letters", "show", str(seqs["too-large"]), env=env
        )
        assert kept.returncode == 0, kept.stderr
        redriven = await asyncio.to_thread(
            run_cli, "dead-letters", "redrive", str(seqs["bad-json"]), env=env
        )
        assert redriven.returncode == 0, redriven.stderr
        assert subjects.event("com.hostile") in redriven.stdout
