"""A run's place in a long line found by its id: a waiter marked ``early`` (put in line by
a process before its append) is found wherever it is, by a run entering under another
time; each segment's outline counts its early waiters exactly. In memory: the segments
as stored are a dict."""

from __future__ import annotations

from interlock.runtime.slotlines import HEAD, SEGMENT, Lines, SlotEntry, Waiter, encode


def since(n: int) -> str:
    return f"2026-12-05T09:{n // 60:02d}:{n % 60:02d}.000Z"


async def line_of(count: int, early: set[int]) -> tuple[Lines, dict[str, tuple[bytes, int]]]:
    """A line of ``count`` runs ``r<n>`` joined at ``since(n)``, those in ``early`` marked,
    written to a store; and the store."""
    store: dict[str, tuple[bytes, int]] = {}

    async def read(key: str) -> tuple[bytes, int]:
        return store.get(key, (b"", 0))

    lines = Lines(None, "slots", "t", SlotEntry(limit="l", key="k", size=1), 0, read)
    for n in range(count):
        await lines.insert(Waiter(f"r{n}", since(n), 1, early=int(n in early)))
    for key, value, _ in lines.writes()[1:]:
        assert value is not None
        store[key] = (value, 1)
    return Lines(None, "slots", "t", lines.entry, 1, read, encode(lines.entry)), store


async def test_an_early_waiter_is_found_by_its_id_wherever_its_new_time_points() -> None:
    count = HEAD + 2 * SEGMENT + 10  # the head, two full segments and a third
    lines, _ = await line_of(count, early={HEAD + 5, count - 1})
    (line,) = lines.entry.lines
    assert [s.early for s in line.segments] == [1, 0, 1]
    # Started again later: its order points past the end of the line.
    assert await lines.find(Waiter(f"r{HEAD + 5}", since(count + 60), 1)) == HEAD + 6
    # Started again by a process whose clock is behind: its order points before its place.
    assert await lines.find(Waiter(f"r{count - 1}", since(0), 1)) == count
    # A waiter put in line from a log is found where its time puts it.
    assert await lines.find(Waiter(f"r{HEAD + 300}", since(HEAD + 300), 1)) == HEAD + 301
    assert await lines.find(Waiter("r-new", since(count + 60), 1)) is None


async def test_each_segment_counts_its_early_waiters_as_they_move() -> None:
    lines, _ = await line_of(HEAD + 40, early={HEAD + 1, HEAD + 2, HEAD + 30})
    (line,) = lines.entry.lines
    assert [s.early for s in line.segments] == [3]
    assert await lines.remove(f"r{HEAD + 2}", "")
    assert [s.early for s in line.segments] == [2]
    await lines.pop_head(line)  # the head empties into the entry: the next 16 move up
    for _ in range(HEAD - 1):
        await lines.pop_head(line)
    await lines.pop_head(line)
    assert [w.run_id for w in lines.entry.waiting][:1] == [f"r{HEAD + 1}"]
    assert [s.early for s in line.segments] == [1]  # r{HEAD + 30} still in the segment
