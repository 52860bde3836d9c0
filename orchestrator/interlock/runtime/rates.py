"""Rates of triggers: at most ``limit`` runs started by a trigger in any ``per``, for each
value of its key.

The triggers bucket keeps, per trigger and key, the start times given to its last
``limit`` events (ascending; some may be in the future: runs waiting their turn). An event
is given the first time at or after now, at or after the last start given (so runs start
in the order their events came), and at least ``per`` after the start ``limit`` places
before it: no ``per`` ever holds more than ``limit`` starts. Each change is a
compare-and-set on that one entry, so two orchestrator replicas never give one time twice.
The entry's message lives (``Nats-TTL``) until its last start is ``per`` old: a quiet key
costs nothing.

An event given a time to come is started at once as a run that waits (``run.queued`` with
``rate``, and a durable timer for its time; :func:`interlock.core.limits.rate_passed`); with
``on_limit: drop`` it is dead-lettered instead (``rate-limited``) and given no time. The
run's id derives from the event as for any trigger, so an event delivered again starts
nothing twice (its second time given is not used).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import APIError, KeyNotFoundError

from interlock.core.rfc3339 import format_time, parse_time
from interlock.core.step import seconds_text
from interlock.core.windowing import RateEntry, decode_rate, encode, next_start, rate_token
from interlock.runtime.keylocks import KeyLocks
from interlock.runtime.triggermetrics import RATE
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

if TYPE_CHECKING:
    from interlock.core.definition import TriggerDef

MAX_TRIES = 64
WRONG_LAST_SEQUENCE = 10071


def _ms(time: str) -> int:
    return int(parse_time(time).timestamp() * 1000)


def _time(ms: int) -> str:
    return format_time(datetime.fromtimestamp(ms / 1000, tz=UTC))


@dataclass(frozen=True, slots=True)
class Given:
    """What :meth:`Rates.give` gave an event: a start now, a start ``at`` a time to come,
    or (``dropped``) none."""

    at: str | None = None
    dropped: bool = False


def dropped(trigger: TriggerDef, key: str) -> str:
    """Why an event over ``trigger``'s rate (``on_limit: drop``) starts no run."""
    rate = trigger.rate
    assert rate is not None
    runs = "run" if rate.limit == 1 else "runs"
    return (
        f"{trigger.name} starts at most {rate.limit} {runs} per {seconds_text(rate.per_s)} for "
        f"key {key!r}: this event is over it and is dropped (on_limit: drop)"
    )


class Rates:
    """The orchestrator's side of triggers' rates (see the module)."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        clock: Callable[[], str],
        observe: Callable[[str, str], None] = lambda what, detail: None,
    ) -> None:
        self._js = jetstream(nc)
        self._subjects = subjects
        self._clock = clock
        self._observe = observe
        self._kv: Any = None
        self._locks = KeyLocks()

    async def _bucket(self) -> Any:
        if self._kv is None:
            self._kv = await self._js.key_value(self._subjects.triggers_bucket)
        return self._kv

    async def give(self, trigger: TriggerDef, key: str) -> Given:
        """A start time for one more event of ``trigger``'s ``key``: now, later (the run
        waits), or none (``drop``: the event is over the rate)."""
        rate = trigger.rate
        assert rate is not None
        token = rate_token(trigger.name, key)
        async with self._locks.locked(token):
            for _ in range(MAX_TRIES):
                kv = await self._bucket()
                try:
                    found = await kv.get(token)
                    revision = found.revision or 0
                    entry = decode_rate(found.value) if found.value else None
                except KeyNotFoundError:
                    revision, entry = 0, None
                except msgspec.DecodeError:
                    entry = None
                entry = entry or RateEntry(trigger=trigger.name, key=key, limit=1, per_s=1.0)
                entry.limit, entry.per_s = rate.limit, rate.per_s  # as the trigger says now
                now = _ms(self._clock())
                at = next_start(entry, now)
                if at > now and rate.on_limit == "drop":
                    self._observe(RATE, "dropped")
                    return Given(dropped=True)
                entry.starts = [*entry.starts, at][-rate.limit :]
                entry.waiting(at, now)
                if not await self._write(token, entry, revision, now):
                    continue
                if at > now:
                    self._observe(RATE, "queued")
                    return Given(at=_time(at))
                self._observe(RATE, "now")
                return Given()
        raise RuntimeError(f"rate of {trigger.name} ({key!r}): too many conflicting writes")

    async def over(self, trigger: TriggerDef, key: str) -> bool:
        """Whether one more event of ``trigger``'s ``key`` now would be over its rate (read
        only: what :meth:`give` would do, as far as the entry now says)."""
        return not self.takes(await self.entry(trigger, key), record=False)

    async def entry(self, trigger: TriggerDef, key: str) -> RateEntry:
        """``trigger``'s ``key``'s entry as the bucket has it now (empty when none), with the
        trigger's rate."""
        rate = trigger.rate
        assert rate is not None
        kv = await self._bucket()
        try:
            found = await kv.get(rate_token(trigger.name, key))
            entry = decode_rate(found.value) if found.value else None
        except (KeyNotFoundError, msgspec.DecodeError):
            entry = None
        entry = entry or RateEntry(trigger=trigger.name, key=key, limit=1, per_s=1.0)
        entry.limit, entry.per_s = rate.limit, rate.per_s
        return entry

    def takes(self, entry: RateEntry, *, record: bool = True) -> bool:
        """Whether ``entry``'s rate takes one more event now (``on_limit: drop``); if so,
        with ``record``, its start is added to ``entry`` (in memory only), as :meth:`give`
        adds it: what the next event finds."""
        now = _ms(self._clock())
        if next_start(entry, now) > now:
            return False
        if record:
            entry.starts = [*entry.starts, now][-entry.limit :]
        return True

    async def _write(self, token: str, entry: RateEntry, revision: int, now_ms: int) -> bool:
        """Write ``entry`` if the key is still at ``revision``; it lives until its last
        start is ``per`` old."""
        ttl = math.ceil((entry.starts[-1] - now_ms) / 1000 + entry.per_s) + 1
        headers = {"Nats-Expected-Last-Subject-Sequence": str(revision), "Nats-TTL": f"{ttl}s"}
        subject = f"$KV.{self._subjects.triggers_bucket}.{token}"
        try:
            await self._js.publish(subject, encode(entry), headers=headers)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return False
            raise
        return True
