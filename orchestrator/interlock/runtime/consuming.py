"""What every consumer of Interlock's streams does the same way when it cannot handle a
message: write a dead letter about it. (Reading consumers: :mod:`interlock.runtime.pulling`.)"""

from __future__ import annotations

from nats.aio.msg import Msg


def dead_letter_headers(msg: Msg, reason: str, detail: str) -> dict[str, str]:
    """The headers of a dead letter about ``msg`` (the orchestrator's and the workers' alike).

    Without the message's own JetStream headers: its ``Nats-Msg-Id`` would make the
    dead-letter stream drop a second letter about the same message, and others
    (``Nats-Expected-*``, ``Nats-Rollup``, ``Nats-TTL``) would act on the dead-letter
    stream. The caller adds its own ``Nats-Msg-Id``.
    """
    headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
    headers["Interlock-Dead-Letter-Reason"] = reason
    headers["Interlock-Dead-Letter-Detail"] = detail[:1000]
    headers["Interlock-Dead-Letter-Subject"] = msg.subject
    return headers
