"""The dead letters the orchestrator, the timers and the agent workers write: one builder,
the letter's id in the agents' form or the orchestrator's."""

from __future__ import annotations

import hashlib

from nats.aio.msg import Msg

from interlock.transport.consuming import DEAD_LETTER_KEPT, dead_letter

ACK = "$JS.ACK.TASKS.cap_review.3.41.17.1733356800000000000.0"
"""The reply subject of a JetStream delivery: stream TASKS, stream sequence 41."""


def _msg(data: bytes = b"{}", reply: str = ACK) -> Msg:
    headers = {
        "Nats-Msg-Id": "sent-once",
        "Nats-Expected-Last-Subject-Sequence": "4",
        "Interlock-Dead-Letter-Truncated": "9",
        "ce-type": "task.requested",
    }
    return Msg(None, subject="il.cap.review", reply=reply, data=data, headers=headers)


def test_an_agents_letter_names_its_stream_sequence_and_reason() -> None:
    headers, data = dead_letter(
        _msg(), "no-run-id", "no run id", 1 << 20, extra={"Interlock-Dead-Letter-Worker": "w"}
    )
    assert data == b"{}"
    assert list(headers.items()) == [
        ("ce-type", "task.requested"),
        ("Interlock-Dead-Letter-Reason", "no-run-id"),
        ("Interlock-Dead-Letter-Detail", "no run id"),
        ("Interlock-Dead-Letter-Subject", "il.cap.review"),
        ("Interlock-Dead-Letter-Worker", "w"),
        ("Nats-Msg-Id", "TASKS.41.no-run-id"),
    ]


def test_the_orchestrators_letter_is_named_by_a_digest_of_reason_detail_and_stored_time() -> None:
    headers, _ = dead_letter(_msg(), "too-large", "3 MB", 1 << 20, digest=True)
    digest = hashlib.sha256(b"too-large\n3 MB\n1733356800000000000").hexdigest()[:16]
    assert headers["Nats-Msg-Id"] == f"TASKS.41.{digest}"
    assert "Interlock-Dead-Letter-Truncated" not in headers
    # The same message delivered again (and through a domain's longer subject): one letter.
    again = "$JS.ACK.hub.ACCHASH.TASKS.cap_review.4.41.18.1733356800000000000.0.x"
    headers, _ = dead_letter(_msg(reply=again), "too-large", "3 MB", 1 << 20, digest=True)
    assert headers["Nats-Msg-Id"] == f"TASKS.41.{digest}"


def test_a_core_message_gets_no_id_and_a_large_one_is_cut() -> None:
    headers, data = dead_letter(_msg(b"x" * 100_000, reply=""), "bad", "big", 64 * 1024)
    assert "Nats-Msg-Id" not in headers
    assert len(data) == DEAD_LETTER_KEPT
    assert headers["Interlock-Dead-Letter-Truncated"] == "100000"
