"""The worker's memory of cancel notices: which attempts a notice covers, and its bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from interlock.sdk.cancels import CancelMemory, parse_time

T0 = datetime(2026, 11, 3, 12, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_notice_naming_an_attempt_covers_that_attempt_only() -> None:
    memory = CancelMemory()
    memory.remember("r.1", 2, T0)
    assert "r.1" in memory
    assert "r.2" not in memory
    assert memory.covers("r.1", 2, T0 - timedelta(seconds=1))
    assert memory.covers("r.1", 2, None)
    assert not memory.covers("r.1", 1, T0 - timedelta(seconds=1))
    assert not memory.covers("r.1", 3, None)
    assert not memory.covers("r.2", 2, None)


def test_a_notice_without_attempt_covers_what_was_requested_before_it() -> None:
    memory = CancelMemory()
    memory.remember("r.1", None, T0)
    assert memory.covers("r.1", 1, T0 + timedelta(seconds=5))  # the first attempt: always
    assert memory.covers("r.1", 3, T0 - timedelta(milliseconds=1))
    assert not memory.covers("r.1", 3, T0)  # a retry requested after a timeout notice
    assert not memory.covers("r.1", 3, T0 + timedelta(seconds=1))
    assert not memory.covers("r.1", 3, None)  # unknown: run it rather than lose a retry


def test_a_notice_without_time_covers_the_first_attempt_only() -> None:
    memory = CancelMemory()
    memory.remember("r.1", None, None)
    assert memory.covers("r.1", 1, None)
    assert not memory.covers("r.1", 2, T0)


def test_notices_for_one_action_add_up() -> None:
    memory = CancelMemory()
    memory.remember("r.1", None, T0)
    memory.remember("r.1", 4, None)
    memory.remember("r.1", None, T0 + timedelta(seconds=10))
    memory.remember("r.1", None, T0)  # an older time does not move the bound back
    assert memory.covers("r.1", 4, T0 + timedelta(seconds=60))
    assert memory.covers("r.1", 2, T0 + timedelta(seconds=9))
    assert not memory.covers("r.1", 2, T0 + timedelta(seconds=11))
    assert len(memory) == 1


def test_the_least_recently_cancelled_action_goes_first_when_full() -> None:
    memory = CancelMemory(capacity=2)
    memory.remember("a", 1, None)
    memory.remember("b", 1, None)
    memory.remember("a", 2, None)  # refreshed: now the newest
    memory.remember("c", 1, None)
    assert len(memory) == 2
    assert not memory.covers("b", 1, None)
    assert memory.covers("a", 1, None)
    assert memory.covers("c", 1, None)


def test_notices_are_forgotten_after_the_ttl() -> None:
    clock = Clock()
    memory = CancelMemory(ttl=60.0, clock=clock)
    memory.remember("a", 1, None)
    clock.now = 30.0
    memory.remember("b", 1, None)
    clock.now = 60.0
    assert memory.covers("a", 1, None)
    clock.now = 61.0
    assert not memory.covers("a", 1, None)
    assert len(memory) == 1
    clock.now = 100.0
    memory.remember("c", 1, None)  # dropping "b", expired since 90 s
    assert len(memory) == 1
    clock.now = 200.0
    memory.remember("c", 2, None)  # an expired entry starts afresh
    assert not memory.covers("c", 1, None)
    assert memory.covers("c", 2, None)


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        CancelMemory(capacity=0)
    with pytest.raises(ValueError, match="ttl"):
        CancelMemory(ttl=0)


def test_parse_time() -> None:
    assert parse_time("2026-11-03T12:00:00.000Z") == T0
    assert parse_time("2026-11-03T12:00:00") == T0  # no offset: UTC
    assert parse_time("yesterday") is None
    assert parse_time(None) is None
    assert parse_time("") is None
