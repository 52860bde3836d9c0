"""The answer desk: requests beyond its limit wait their turn and are all replied to."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.aio.msg import Msg

from interlock.runtime.answering import AnswerDesk, AnswerReply
from interlock.transport import tasks
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.subjects import Subjects


async def test_requests_past_the_limit_wait_their_turn(
    nats_url: str, nc: Client, subjects: Subjects
) -> None:
    served = await connect(ConnectOptions.resolve(nats_url, name="answer desk test"))
    gate = asyncio.Event()
    in_hand: list[bytes] = []
    most = 0

    async def handle(msg: Msg) -> AnswerReply:
        nonlocal most
        in_hand.append(msg.data)
        most = max(most, len(in_hand))
        await gate.wait()
        in_hand.remove(msg.data)
        return tasks.ANSWER_RECORDED, None, None

    async def refuse(msg: Msg, reason: str, detail: str) -> None:
        raise AssertionError(f"refused {msg.reply}: {reason}")

    desk = AnswerDesk(served, subjects, handle, refuse, limit=2)
    await desk.start()
    try:
        await served.flush()
        subject = subjects.answer("cap", "r1")
        replies = [
            asyncio.ensure_future(nc.request(subject, str(i).encode(), timeout=10))
            for i in range(5)
        ]
        for _ in range(1_000):
            if len(in_hand) == 2:
                break
            await asyncio.sleep(0.01)
        assert not any(r.done() for r in replies)
        gate.set()
        answered = await asyncio.gather(*replies)
        assert [r.headers[tasks.ANSWER_HEADER] for r in answered if r.headers] == [
            tasks.ANSWER_RECORDED
        ] * 5
        assert most == 2
    finally:
        await desk.stop()
        await served.close()
