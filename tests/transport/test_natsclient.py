"""Interlock's NATS client: nats-py's results with less work per message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats import errors
from nats.aio.client import Client, _validate_subject
from nats.aio.msg import Msg

from interlock.runtime.embedded import EmbeddedNats
from interlock.runtime.logstore import RunLog
from interlock.runtime.waiting import RunWatcher
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.natsclient import NatsClient, ack_nowait, direct_subscriber, round_trip
from interlock.transport.subjects import Subjects

_PIECES = st.sampled_from(
    [
        b":",
        b" ",
        b"\t",
        b"\r\n",
        b"\x1c",
        b"\x1f",
        b"\x0b",
        b"a",
        b"Nats-Msg-Id",
        b"\xff",
        "é".encode(),
    ]
)


@given(st.lists(st.one_of(_PIECES, st.binary(max_size=6)), max_size=20).map(b"".join))
def test_headers_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert NatsClient._parse_header_lines(raw) == Client._parse_header_lines(raw)


def test_headers_of_a_run_log_append_parse_as_before() -> None:
    raw = (
        b"Nats-Msg-Id: r1:3\r\nNats-Expected-Last-Subject-Sequence:12\r\n"
        b"ce-source : bench://x \r\nbad name: skipped\r\n\xffname: skipped\r\n"
        b"value: caf\xc3\xa9\r\n\r\n"
    )
    parsed = NatsClient._parse_header_lines(raw)
    assert parsed == Client._parse_header_lines(raw)
    assert parsed == {
        "Nats-Msg-Id": "r1:3",
        "Nats-Expected-Last-Subject-Sequence": "12",
        "ce-source": "bench://x",
        "value": "café",
    }


async def _until_subscribed(
    nc: Client, fast: NatsClient, subject: str, arrived: asyncio.Event
) -> None:
    """Probe ``subject`` until a message reaches the handler (nats-py's ``flush`` may
    overtake a SUB still in its buffer, so it does not prove the interest is known), then
    until every probe sent has reached it: a slow machine can have sent a few before the
    first arrives, and one arriving later would be taken for a message of the test."""
    arrived.clear()
    for _ in range(100):
        await nc.publish(subject, b"probe")
        try:
            await asyncio.wait_for(arrived.wait(), 0.05)
        except TimeoutError:
            continue
        await _delivered(nc, fast)
        return
    raise AssertionError(f"no message reached the handler of {subject}")


async def _delivered(nc: Client, fast: NatsClient) -> None:
    """Until ``fast`` has taken in every message published on ``nc`` so far: the server has
    had them all (a round trip on ``nc``: nats-py's own ``flush`` alone may overtake what
    its buffer holds), so it has sent ``fast`` the ones it gets before its answer to a
    later ``flush``."""
    await round_trip(nc)
    await fast.flush()


@pytest.fixture
async def fast(nats_url: str) -> AsyncIterator[NatsClient]:
    nc = await connect(ConnectOptions.resolve(nats_url, name="natsclient test"))
    assert isinstance(nc, NatsClient)
    try:
        yield nc
    finally:
        await nc.close()


async def test_a_direct_handler_gets_every_message_in_order_with_headers(
    fast: NatsClient, nc: Client
) -> None:
    got: list[Msg] = []
    arrived = asyncio.Event()

    def handler(msg: Msg) -> None:
        got.append(msg)
        arrived.set()

    sub = await fast.subscribe_direct("natsclient.direct", handler)
    await _until_subscribed(nc, fast, "natsclient.direct", arrived)
    got.clear()
    for i in range(50):
        await nc.publish("natsclient.direct", str(i).encode(), headers={"n": str(i)})
    await nc.publish("natsclient.direct", b"plain")
    await _delivered(nc, fast)
    assert [m.data for m in got] == [str(i).encode() for i in range(50)] + [b"plain"]
    assert [m.headers for m in got[:2]] == [{"n": "0"}, {"n": "1"}]
    assert got[-1].headers is None
    # Replies work as on any message.
    got.clear()
    arrived.clear()
    answer = asyncio.ensure_future(nc.request("natsclient.direct", b"ping", timeout=5))
    await asyncio.wait_for(arrived.wait(), 5)
    await got[0].respond(b"pong")
    assert (await answer).data == b"pong"
    # Unsubscribed: nothing more arrives, and the handler is gone.
    await sub.unsubscribe()
    await nc.publish("natsclient.direct", b"late")
    await _delivered(nc, fast)
    assert [m.data for m in got] == [b"ping"]
    assert sub._id not in fast._direct


async def test_a_direct_handler_is_in_place_before_its_sub_is_sent(nats_url: str) -> None:
    """``subscribe`` can wait for the outbound buffer to be written out before it returns,
    and the server may then deliver a message at once: its handler must already be known,
    or the message goes to the subscription's queue, which no one reads."""
    known_when_sent: list[bool] = []

    class Watched(NatsClient):
        async def _send_command(self, cmd: bytes, priority: bool = False) -> None:
            if cmd.startswith(b"SUB "):
                known_when_sent.append(int(cmd.split()[-1]) in self._direct)
            await super()._send_command(cmd, priority)

    fast = Watched()
    await fast.connect(nats_url, max_reconnect_attempts=0)
    try:
        subs = [
            await fast.subscribe_direct("natsclient.early", lambda _: None),
            await fast.subscribe_direct("natsclient.early", lambda _: None, queue="q"),
        ]
        assert known_when_sent == [True, True]
        assert sorted(fast._direct) == sorted(sub._id for sub in subs)
        with pytest.raises(errors.BadSubjectError):
            await fast.subscribe_direct("", lambda _: None)
        assert sorted(fast._direct) == sorted(sub._id for sub in subs)  # none left behind
    finally:
        await fast.close()


async def test_a_failing_handler_is_reported_and_the_connection_reads_on(
    nats_url: str, nc: Client
) -> None:
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    fast = NatsClient()
    await fast.connect(nats_url, error_cb=on_error, max_reconnect_attempts=0)
    try:
        seen: list[bytes] = []

        def handler(msg: Msg) -> None:
            if msg.data == b"boom":
                raise ValueError("boom")
            seen.append(msg.data)

        arrived = asyncio.Event()

        def probed(msg: Msg) -> None:
            arrived.set()
            handler(msg)

        await fast.subscribe_direct("natsclient.fails", probed)
        await _until_subscribed(nc, fast, "natsclient.fails", arrived)
        seen.clear()
        for data in (b"one", b"boom", b"two"):
            await nc.publish("natsclient.fails", data)
        await _delivered(nc, fast)
        assert seen == [b"one", b"two"]
        assert [str(e) for e in errors] == ["boom"]
        assert fast.is_connected
    finally:
        await fast.close()


def test_only_interlocks_client_offers_direct_subscriptions() -> None:
    assert direct_subscriber(NatsClient()) is not None
    assert direct_subscriber(Client()) is None


async def _sent(client: Client, send: Any, headers: dict[str, str]) -> bytes | str:
    """What ``send`` (a ``_send_publish``) queues for the server, or the error it raises."""
    sent: list[bytes] = []

    async def capture(cmd: bytes, priority: bool = False) -> None:
        sent.append(cmd)

    client._send_command = capture  # type: ignore[method-assign]
    try:
        await send(client, "a.b", "_INBOX.x", b"data", 4, headers)
    except errors.BadHeaderError as exc:
        return f"BadHeaderError({exc})"
    return b"".join(sent)


_NAMES = st.sampled_from(["Nats-Msg-Id", "ce-type", " padded ", "", "  ", "bad name", "é", "a:b"])
_VALUES = st.text(st.sampled_from("ab \t\r\né%"), max_size=8)


@settings(deadline=None)
@given(st.dictionaries(st.one_of(_NAMES, st.text(max_size=4)), _VALUES, max_size=5))
async def test_headers_go_out_as_nats_py_sends_them(headers: dict[str, str]) -> None:
    fast = NatsClient()
    for _ in range(2):  # the second time from the cache of names
        ours = await _sent(fast, NatsClient._send_publish, headers)
        theirs = await _sent(Client(), Client._send_publish, headers)
        assert ours == theirs


# --- flush after a subscription ----------------------------------------------------------

ALLOWED = "natsclient.allowed"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose one user may subscribe to ``ALLOWED.>`` and inboxes only."""
    folder = tmp_path_factory.mktemp("guarded")
    config = folder / "server.conf"
    config.write_text(
        "authorization { users = [ {user: u, password: p, permissions: "
        f'{{subscribe: {{allow: ["{ALLOWED}.>", "_INBOX.>"]}}}}}} ] }}\n'
    )
    with EmbeddedNats(folder / "store", args=("-c", str(config))) as server:
        yield server.url.replace("nats://", "nats://u:p@")


async def _refused_by_then(
    guarded: str, make: Callable[[], Client], settle: Callable[[Client], Awaitable[None]]
) -> list[bool]:
    """For 50 subscriptions the server refuses, whether the refusal had arrived when
    ``settle`` returned (just after the ``subscribe``)."""
    refusals: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        refusals.append(exc)

    client = make()
    await client.connect(guarded, error_cb=on_error, max_reconnect_attempts=0)
    try:
        seen: list[bool] = []
        for n in range(50):
            before = len(refusals)
            await client.subscribe(f"natsclient.refused.{n}")
            await settle(client)
            seen.append(len(refusals) > before)
        return seen
    finally:
        await client.close()


async def test_a_flush_comes_after_a_subscription_still_buffered(guarded: str) -> None:
    """nats-py's PING overtakes a SUB its flusher has not written yet (then the server
    answers the flush before it has, or has refused, the subscription): about one time in
    ten here. Interlock's client writes what is buffered first."""

    async def flush(client: Client) -> None:
        await client.flush()

    assert all(await _refused_by_then(guarded, NatsClient, flush))


async def test_a_round_trip_is_that_barrier_on_nats_pys_client_too(guarded: str) -> None:
    assert all(await _refused_by_then(guarded, Client, round_trip))
    assert all(await _refused_by_then(guarded, NatsClient, round_trip))


@pytest.mark.parametrize("make", [NatsClient, Client], ids=["interlock", "nats-py"])
async def test_a_refused_run_log_subscription_is_known_once_a_wait_has_subscribed(
    guarded: str, make: Callable[[], Client]
) -> None:
    """What waits rely on: a refused subscription is known when the watcher has started
    (its waits then read each log every second rather than wait for hints)."""
    client = make()
    await client.connect(guarded, error_cb=_ignore, max_reconnect_attempts=0)
    subjects = Subjects("natsclient")
    try:
        hinted = []
        for _ in range(30):
            watcher = RunWatcher(client, subjects, RunLog(client, subjects))
            await watcher.start()
            hinted.append(watcher.hinted)
            await watcher.close()
        assert hinted == [False] * 30
    finally:
        await client.close()


async def _ignore(exc: Exception) -> None:
    pass


_STATUSES = ["CONNECTED", "CLOSED", "DRAINING_PUBS", "DRAINING_SUBS", "RECONNECTING", "CONNECTING"]


@pytest.mark.parametrize("status", _STATUSES)
@pytest.mark.parametrize(
    ("subject", "reply", "size", "pending", "limit"),
    [
        ("a.b", "", 10, 0, 100),
        ("a.b", "_INBOX.x", 10, 95, 100),
        ("a.b", "", 10, 0, 0),
        ("a.b", "", 200, 0, 1_000),
        ("", "", 10, 0, 100),
        ("a b", "", 10, 0, 100),
        ("a.b", "bad\r\nreply", 10, 0, 100),
    ],
)
async def test_publish_checks_as_nats_py_checks(
    status: str, subject: str, reply: str, size: int, pending: int, limit: int
) -> None:
    outcomes = []
    for cls in (NatsClient, Client):
        client = cls()
        client._status = getattr(Client, status)
        client._max_payload = 100
        client._max_pending_size = limit
        client._pending_data_size = pending
        sent: list[tuple[Any, ...]] = []

        async def capture(*args: Any, sent: list[tuple[Any, ...]] = sent) -> None:
            sent.append(args)

        client._send_publish = capture  # type: ignore[method-assign]
        try:
            await client.publish(subject, b"x" * size, reply=reply, headers={"h": "1"})
        except errors.Error as exc:
            outcomes.append(type(exc).__name__)
        else:
            outcomes.append(repr(sent))
    assert outcomes[0] == outcomes[1]


# --- publishing without awaiting --------------------------------------------------------


class _Flusher:
    """Stands for a running flusher task."""

    def done(self) -> bool:
        return False


def _ready(client: NatsClient, *, pending: int = 0, limit: int = 1_000) -> None:
    client._status = Client.CONNECTED
    client._max_payload = 100
    client._max_pending_size = limit
    client._pending_data_size = pending
    client._flush_queue = asyncio.Queue()
    client._flusher_task = _Flusher()  # type: ignore[assignment]


@pytest.mark.parametrize("headers", [None, {"Nats-Msg-Id": "a.1", "ce-type": "x\r\ny"}])
@pytest.mark.parametrize("reply", ["", "_INBOX.x.1"])
async def test_publish_nowait_buffers_what_publish_buffers(
    headers: dict[str, str] | None, reply: str
) -> None:
    buffered = []
    for nowait in (True, False):
        client = NatsClient()
        _ready(client)
        if nowait:
            assert client.publish_nowait("a.b", b"data", reply=reply, headers=headers)
        else:
            await client.publish("a.b", b"data", reply=reply, headers=headers)
        # Both wake the flusher once, and count the message.
        assert client._flush_queue is not None
        assert client._flush_queue.qsize() == 1
        buffered.append((client._pending, client._pending_data_size, client.stats["out_msgs"]))
    assert buffered[0] == buffered[1]


@pytest.mark.parametrize(
    ("status", "pending", "size", "expected"),
    [
        ("CONNECTED", 0, 10, "sent"),
        ("RECONNECTING", 0, 10, "waits"),
        ("DRAINING_SUBS", 0, 10, "waits"),
        ("CLOSED", 0, 10, "waits"),
        ("CONNECTED", 990, 10, "waits"),  # over the buffer's limit: publish flushes first
        ("CONNECTED", 0, 200, "MaxPayloadError"),
    ],
)
async def test_publish_nowait_sends_only_where_publish_would_not_wait(
    status: str, pending: int, size: int, expected: str
) -> None:
    client = NatsClient()
    _ready(client, pending=pending)
    client._status = getattr(Client, status)
    try:
        sent = client.publish_nowait("a.b", b"x" * size)
    except errors.Error as exc:
        outcome = type(exc).__name__
    else:
        outcome = "sent" if sent else "waits"
    assert outcome == expected
    if outcome != "sent":
        assert client._pending == []


@pytest.mark.parametrize(("subject", "reply"), [("", ""), ("a b", ""), ("a.b", "bad\r\nreply")])
async def test_publish_nowait_refuses_bad_subjects_as_publish_does(
    subject: str, reply: str
) -> None:
    outcomes = []
    for nowait in (True, False):
        client = NatsClient()
        _ready(client)
        try:
            if nowait:
                client.publish_nowait(subject, b"x", reply=reply)
            else:
                await client.publish(subject, b"x", reply=reply)
        except errors.Error as exc:
            outcomes.append(type(exc).__name__)
    assert len(outcomes) == 2
    assert outcomes[0] == outcomes[1]


_SUBJECT_TEXT = st.text(
    alphabet=st.sampled_from("a.> *\t\r\n\x0b\x0c\x1c\u2028\u00a0é$_"), max_size=6
)


@settings(max_examples=300)
@given(_SUBJECT_TEXT, _SUBJECT_TEXT)
async def test_subjects_are_refused_as_nats_py_refuses_them(subject: str, reply: str) -> None:
    """publish and publish_nowait refuse exactly the subjects and replies nats-py's check
    refuses (empty, or holding a space, tab, CR or LF), and no other."""
    try:
        _validate_subject(subject)
        if reply:
            _validate_subject(reply)
    except errors.BadSubjectError:
        refused = True
    else:
        refused = False
    for nowait in (True, False):
        client = NatsClient()
        _ready(client)
        sent: list[tuple[Any, ...]] = []

        async def capture(*args: Any, sent: list[tuple[Any, ...]] = sent) -> None:
            sent.append(args)

        client._send_publish = capture  # type: ignore[method-assign]
        try:
            if nowait:
                assert client.publish_nowait(subject, b"x", reply=reply)
            else:
                await client.publish(subject, b"x", reply=reply)
        except errors.BadSubjectError:
            assert refused
        else:
            assert not refused


async def test_publish_nowait_waits_for_a_flusher_that_is_gone() -> None:
    client = NatsClient()
    _ready(client)
    client._flusher_task = None
    assert not client.publish_nowait("a.b", b"x")


async def test_an_ack_without_awaiting_acknowledges_the_message(
    nats_url: str, subjects: Subjects
) -> None:
    """A message acked with ``ack_nowait`` is acknowledged as ``ack()`` does it; on
    nats-py's client, or once acked, it says the caller must await ``ack()``."""
    client = await connect(ConnectOptions.resolve(nats_url))
    js = client.jetstream()
    stream, subject = f"{subjects.prefix}_ACKNOWAIT", f"{subjects.prefix}.acknowait"
    try:
        await js.add_stream(name=stream, subjects=[f"{subject}.>"])
        await js.publish(f"{subject}.a", b"1")
        sub = await js.pull_subscribe(f"{subject}.>", durable="d", stream=stream)
        [msg] = await sub.fetch(1, timeout=5)
        assert isinstance(client, NatsClient)
        assert ack_nowait(msg)
        assert not ack_nowait(msg)  # acked already: ack() raises as it does
        with pytest.raises(errors.MsgAlreadyAckdError):
            await msg.ack()
        await client.flush()
        info = await js.consumer_info(stream, "d")
        assert (info.num_ack_pending, info.num_pending) == (0, 0)
        plain = Msg(client, subject="x", reply="y")
        plain._client = Client()
        assert not ack_nowait(plain)
    finally:
        await client.close()


async def test_a_request_goes_to_the_socket_before_the_loop_turns(
    fast: NatsClient, nc: Client
) -> None:
    """``now=True`` writes the buffer, the request last, to the socket in the call (no
    turn of the event loop for the flusher), once per turn: later requests of the same
    turn wait for the flusher, with everything else."""
    got: list[bytes] = []
    arrived = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        got.append(msg.data)
        arrived.set()

    await nc.subscribe("natsclient.now", cb=on_msg)
    await round_trip(nc)
    assert fast.publish_nowait("natsclient.now", b"buffered")
    assert fast._pending  # left to the flusher
    assert fast.publish_nowait("natsclient.now", b"request", reply="_INBOX.x.1", now=True)
    assert fast._pending == []  # written, with what was buffered before it
    assert fast.publish_nowait("natsclient.now", b"second request", now=True)
    assert fast._pending  # one write of its own per turn: this one waits for the flusher
    await asyncio.sleep(0)  # the loop turns
    assert fast.publish_nowait("natsclient.now", b"next turn", now=True)
    assert fast._pending == []
    await round_trip(fast)
    while len(got) < 4:
        arrived.clear()
        await asyncio.wait_for(arrived.wait(), 5)
    assert got == [b"buffered", b"request", b"second request", b"next turn"]
