"""Which waiter a free slot goes to (fair share over recent use), and which changes of a
slots entry go in the next write: those that take or hand on a slot before runs entering a
long line, never for more than a few writes in a row."""

from __future__ import annotations

import asyncio
import math

from interlock.core import events as ev
from interlock.runtime import slotuse
from interlock.runtime.slotlines import STRIDE, Line, Lines, SlotEntry, Waiter, encode
from interlock.runtime.slotstore import decode_entry
from interlock.runtime.slotturns import (
    MAX_DEFERRED,
    admit,
    let_go,
    let_go_all,
    pick,
    recent,
    urgent_first,
)


async def test_urgent_changes_go_first_and_the_others_wait_a_few_writes_at_most() -> None:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(4)]
    batch = list(zip("abcd", futures, strict=True))
    urgent = {futures[1], futures[3]}
    now, later = urgent_first(batch, urgent, 0)
    assert [name for name, _ in now] == ["b", "d"]
    assert [name for name, _ in later] == ["a", "c"]
    assert urgent == set()  # told once
    # Nothing urgent, or everything: all in one write.
    assert urgent_first(batch, set(), 0) == (batch, [])
    assert urgent_first(batch, set(futures), 0) == (batch, [])
    # Left behind MAX_DEFERRED writes in a row: everything goes, in the order asked.
    assert urgent_first(batch, {futures[1]}, MAX_DEFERRED) == (batch, [])


# -- fair share over recent use ---------------------------------------------------------


def _entry(size: int, *keys: tuple[str, int]) -> SlotEntry:
    """An entry of ``size`` slots with a line (no segment) for each (key, weight)."""
    lines = [Line(fair=fair, weight=weight, segments=[]) for fair, weight in keys]
    return SlotEntry(limit="wf", key="all", size=size, lines=lines)


def _serve(entry: SlotEntry, admissions: int, flooding: set[str]) -> list[str]:
    """``admissions`` slots handed on, one per holder's end (the oldest ends first), each
    to the line :func:`pick` picks; the keys of ``flooding`` never run out of runs, the
    others leave with their last. The keys served, in order."""
    served: list[str] = []
    for n in range(admissions):
        if len(entry.holders) >= entry.size:
            entry.holders.pop(0)
        line = pick(entry)
        line.passed += STRIDE // line.weight
        admit(entry, Waiter(f"{line.fair}-{n}", "", entry.size, fair=line.fair), line.fair)
        served.append(line.fair)
    return served


def test_a_key_that_used_no_slots_lately_goes_before_the_key_that_held_them_all() -> None:
    """A flooded the ten slots for a long time: B, joining with a backlog of its own, is
    given every slot that frees (A's holders end one by one) until B's slots and recent
    use reach A's; then they take turns."""
    entry = _entry(10, ("A", 1))
    _serve(entry, 500, {"A"})
    assert [h.fair for h in entry.holders] == ["A"] * 10
    assert recent(entry)["A"] > 0.9 * slotuse.WINDOW * 10  # near W: every admission its
    entry.lines.append(Line(fair="B", weight=1, segments=[]))
    served = _serve(entry, 200, {"A", "B"})
    first_a = served.index("A")
    assert served[:first_a] == ["B"] * first_a
    assert first_a >= 10  # all ten slots B's before A is given one again
    # Then equal shares: as many of each in the long run.
    later = served[100:]
    assert abs(later.count("A") - later.count("B")) <= 2


def test_a_flooding_key_is_held_back_by_a_second_flood_for_a_bounded_number_of_admissions() -> None:
    """The bound the docs state: a key that kept every slot busy waits at most W ln 2 + 1
    admissions (W = WINDOW x the limit) while a key with no recent use catches up; at a
    window of four limits, at most W / 2 + 1."""
    for size in (1, 2, 10, 50):
        entry = _entry(size, ("A", 1))
        _serve(entry, 40 * size, {"A"})
        entry.lines.append(Line(fair="B", weight=1, segments=[]))
        window = slotuse.WINDOW * size
        first_a = _serve(entry, 2 * window, {"A", "B"}).index("A")
        assert size <= first_a <= window * math.log(2) + 1, (size, first_a)
        assert first_a <= window // 2 + 1, (size, first_a)


def test_weights_converge_to_their_ratio_of_admissions() -> None:
    """Two keys keep a backlog: over a long sequence each is given slots in proportion to
    its weight (within a few percent), whichever key held the slots before, even where
    the weights' ratio is beyond the window of four limits."""
    for size, heavy, light in ((10, 2, 1), (10, 3, 2), (5, 2, 1), (1, 10, 1), (2, 100, 1)):
        for head_start in ("acme", "beta"):
            entry = _entry(size, (head_start, 1))
            _serve(entry, 100, {head_start})
            entry.lines = [Line("acme", heavy, []), Line("beta", light, [])]
            served = _serve(entry, 8000, {"acme", "beta"})[1000:]
            ratio = served.count("acme") / served.count("beta") / (heavy / light)
            assert 0.95 < ratio < 1.05, (size, heavy, light, head_start, ratio)


def test_recent_use_is_kept_for_a_bounded_number_of_keys() -> None:
    """Keys counting less than FLOOR are forgotten, and at most MAX_KEYS are kept (the
    largest): a flood of keys, each admitted once, cannot grow the entry."""
    entry = _entry(1)
    for n in range(1000):
        admit(entry, Waiter(f"r{n}", "", 1, fair=f"key-{n}"), f"key-{n}")
        entry.holders.clear()
        assert len(entry.used) <= slotuse.MAX_KEYS
        assert all(value >= slotuse.FLOOR for value in recent(entry).values())
    assert entry.admitted == 1000
    assert "key-999" in recent(entry)  # the last admitted is kept
    assert "key-0" not in recent(entry)  # long forgotten: counts 0
    big = _entry(1000)
    for n in range(1000):
        admit(big, Waiter(f"r{n}", "", 1000, fair=f"key-{n}"), f"key-{n}")
    assert len(big.used) == slotuse.MAX_KEYS
    assert "key-999" in recent(big)  # the most recent, the largest counts


def test_an_entry_written_before_recent_use_was_kept_decodes_and_shares_equally() -> None:
    """An entry as stored before (no ``admitted``, no ``used``) decodes, every key counting
    no use: the slots go by the slots held, as before; the next admission counts."""
    old = (
        b'{"limit":"wf","key":"all","size":2,'
        b'"holders":[["a1","2026-12-05T03:00:00.000Z",2,0,"A",1,0]],'
        b'"waiting":[["a2","2026-12-05T03:00:01.000Z",2,0,"A",1,0],'
        b'["b1","2026-12-05T03:00:02.000Z",2,0,"B",1,0]],"turn":"A",'
        b'"lines":[["A",1,[],0,0],["B",1,[],0,0]],"per_s":0.0,"burst":0,"tat":0.0}'
    )
    entry = decode_entry("bucket", "t", old)
    assert entry is not None
    assert (entry.admitted, entry.used, recent(entry)) == (0, [], {})
    line = pick(entry)
    assert line.fair == "B"  # A holds one, B none
    admit(entry, Waiter("b1", "", 2, fair="B"), "B")
    assert (entry.admitted, recent(entry)) == (1, {"B": 1.0})
    assert decode_entry("bucket", "t", encode(entry)) == entry


def test_a_holder_let_go_leaves_the_others_in_their_order() -> None:
    holders = [Waiter(f"r{i}", "2026-12-05T11:00:00Z", 10) for i in range(5)]
    entry = SlotEntry(limit="l", key="k", size=10, holders=list(holders))
    assert let_go(entry, "r2")
    assert [h.run_id for h in entry.holders] == ["r0", "r1", "r3", "r4"]
    assert not let_go(entry, "r2")
    assert len(entry.holders) == 4
    # Named twice (as only an entry written by hand may say): gone both times.
    twice = SlotEntry(limit="l", key="k", size=10, holders=[*holders, holders[1]])
    assert let_go(twice, "r1")
    assert [h.run_id for h in twice.holders] == ["r0", "r2", "r3", "r4"]


async def test_runs_that_end_together_let_go_in_one_pass_and_hand_the_slots_on() -> None:
    """Several runs of one limit and key freed in one change: each holder taken out (the
    others in their order), a run in line given the slot that frees; a run that is in
    neither (freed already) has every holder named, whose admission may be left undone."""
    claim = ev.SlotClaim(limit="l", key="k", size=3)
    holders = [Waiter(f"r{i}", "2026-12-05T11:00:00Z", 3) for i in range(4)]
    lines = Lines(None, "slots", "t", SlotEntry(limit="l", key="k", size=3), 0)
    lines.entry.holders = holders[:3]
    await lines.insert(holders[3])  # r3 waits
    assert await let_go_all(lines, [(claim, "r0"), (claim, "r2")]) == ["r3"]
    assert [h.run_id for h in lines.entry.holders] == ["r1", "r3"]
    assert lines.entry.queued == 0
    # r0 again (freed already) beside r1: every holder left is named.
    assert await let_go_all(lines, [(claim, "r0"), (claim, "r1")]) == ["r3"]
    assert [h.run_id for h in lines.entry.holders] == ["r3"]
    # One alone: in place, as one release does.
    assert await let_go_all(lines, [(claim, "r3")]) == []
    assert lines.entry.holders == []
