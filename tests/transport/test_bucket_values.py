"""Reading a whole KV bucket in one pass: every live key, none that was deleted, none missed."""

from __future__ import annotations

import asyncio
import uuid

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig

from interlock.transport.kvread import bucket_values, stored_keys


async def _bucket(js: JetStreamContext, history: int = 1):
    return await js.create_key_value(
        KeyValueConfig(bucket=f"bv_{uuid.uuid4().hex[:10]}", history=history, direct=True)
    )


async def test_an_empty_bucket_reads_as_nothing(js: JetStreamContext) -> None:
    kv = await _bucket(js)
    assert await bucket_values(kv) == {}


async def test_every_key_is_read_and_deleted_keys_are_not(js: JetStreamContext) -> None:
    kv = await _bucket(js, history=5)
    for round_ in range(3):
        for n in range(300):
            await kv.put(f"k.{n}", f"{round_}-{n}".encode())
    for n in range(0, 300, 7):
        await kv.delete(f"k.{n}")
    await kv.purge("k.1")
    expected = {f"k.{n}": f"2-{n}".encode() for n in range(300) if n % 7 and n != 1}
    assert await bucket_values(kv) == expected


async def test_a_bucket_whose_newest_record_is_a_delete(js: JetStreamContext) -> None:
    kv = await _bucket(js)
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    await kv.delete("b")
    assert await bucket_values(kv) == {"a": b"1"}


async def test_a_read_right_after_each_write_sees_that_write(js: JetStreamContext) -> None:
    # The read follows a put at once, as `interlock apply` then `start` do: the key just
    # written must be there every time, with many readers racing the writer.
    kv = await _bucket(js)
    for n in range(40):
        await kv.put(f"wf.{n}", b"x" * 2000)
        seen = await asyncio.gather(*(bucket_values(kv) for _ in range(5)))
        assert all(f"wf.{n}" in values and len(values) == n + 1 for values in seen)


async def test_stored_keys_lists_the_keys_under_a_pattern_that_hold_a_value(
    js: JetStreamContext,
) -> None:
    kv = await _bucket(js, history=3)
    assert await stored_keys(kv, "wf.default.echo.*") == []
    for version in range(1, 201):
        await kv.put(f"wf.default.echo.{version}", b"manifest")
        await kv.put(f"wf.default.echo.{version}", b"again")
    await kv.put("wf.default.other.1", b"manifest")
    await kv.put("latest.default.echo", b"200")
    await kv.delete("wf.default.echo.7")
    await kv.purge("wf.default.echo.8")
    expected = sorted(f"wf.default.echo.{v}" for v in range(1, 201) if v not in (7, 8))
    assert await stored_keys(kv, "wf.default.echo.*") == expected


async def test_stored_keys_right_after_each_write_sees_that_write(js: JetStreamContext) -> None:
    # As `interlock apply` then `interlock workflows NAME` do: the version just stored is
    # listed every time, with readers racing the writer (the watcher's own "nothing
    # pending" marker can come before the records, and a list that stopped at it lost
    # them).
    kv = await _bucket(js)
    for n in range(1, 41):
        await kv.put(f"wf.default.echo.{n}", b"x" * 2000)
        seen = await asyncio.gather(*(stored_keys(kv, "wf.default.echo.*") for _ in range(5)))
        assert all(len(keys) == n and f"wf.default.echo.{n}" in keys for keys in seen)


async def test_reads_leave_no_consumer_behind(js: JetStreamContext) -> None:
    # A stream takes at most 1,000 consumers, and a watch's stays for minutes after it
    # stops: reads made as watches, polled, filled it and refused every watch after.
    kv = await _bucket(js)
    await kv.put("wf.default.echo.1", b"x")
    for _ in range(50):
        assert await bucket_values(kv) == {"wf.default.echo.1": b"x"}
        assert await stored_keys(kv, "wf.default.echo.*") == ["wf.default.echo.1"]
    info = await js.stream_info(f"KV_{kv._name}")
    assert info.state.consumer_count == 0
