"""Who may call the gateway: bearer tokens mapped to roles, stored hashed in a KV bucket.

Roles:

- ``operator``: everything (publish any event, start, cancel, signal, redrive, read).
- ``publisher``: ``POST /events`` for event types matching its patterns (NATS subject
  wildcards over the type's dot-separated words: ``*`` one word, ``>`` the rest), as the
  NATS publisher role may publish only on ``<prefix>.events.<pattern>``.
- ``reader``: every ``GET`` of the REST API (runs, logs, workflows, dead letters).

Webhooks need no token: their signature is their credential.

A token is shown once when issued (``interlock tokens create``); the bucket keeps only its
SHA-256, under ``t.<hex digest>``, with the token's name, role and patterns. Tokens are
long random strings, so one unsalted hash is enough: there is nothing to guess.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from interlock.runtime.foreign import bucket_object
from interlock.transport.kvread import bucket_values
from interlock.transport.subjects import Subjects

TOKEN_ROLES = ("operator", "publisher", "reader")
"""The roles of the gateway's HTTP bearer tokens (not NATS credentials: those have
:data:`interlock.auth.roles.NATS_ROLES`)."""
TOKEN_PREFIX = "ilt_"  # noqa: S105 - a marker, not a secret
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PATTERN_WORD = re.compile(r"^(\*|>|[A-Za-z0-9_-]+)$")
_CACHE_S = 5.0
"""How long a looked-up token is trusted without asking the bucket again (revocation delay)."""
RECHECK_S = 1.0
"""How often an open stream asks whether its token still stands: with answers at most
``_CACHE_S - RECHECK_S`` old, a revoked token's stream ends within ``_CACHE_S``, as its new
requests are refused."""
STREAM_MAX_AGE_S = _CACHE_S - RECHECK_S


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request, and what its role lets it do."""

    name: str
    role: str
    events: tuple[str, ...] = ()

    def may_publish(self, event_type: str) -> bool:
        if self.role == "operator":
            return True
        if self.role != "publisher":
            return False
        return any(type_matches(pattern, event_type) for pattern in self.events)

    @property
    def may_read(self) -> bool:
        return self.role in ("operator", "reader")

    @property
    def may_operate(self) -> bool:
        return self.role == "operator"


OPEN = Caller(name="open", role="operator")
"""The caller of a gateway run open (loopback only, development)."""


def type_matches(pattern: str, event_type: str) -> bool:
    """NATS subject wildcard matching over the dot-separated words of an event type."""
    want, got = pattern.split("."), event_type.split(".")
    for i, word in enumerate(want):
        if word == ">":
            return len(got) > i
        if i >= len(got) or (word != "*" and word != got[i]):
            return False
    return len(want) == len(got)


def check_pattern(pattern: str) -> None:
    """Raise ValueError unless ``pattern`` is an event type pattern."""
    words = pattern.split(".")
    if not all(_PATTERN_WORD.match(w) for w in words) or ">" in words[:-1]:
        raise ValueError(
            f"event pattern {pattern!r}: dot-separated words of letters, digits, '_' or '-', "
            "'*' for one word, '>' (last) for the rest"
        )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _caller(body: dict[str, Any]) -> Caller | None:
    """The caller a stored token stands for (None: the value is not one Interlock wrote)."""
    name, role, events = body.get("name"), body.get("role"), body.get("events", [])
    if not isinstance(name, str) or not isinstance(role, str) or not isinstance(events, list):
        return None
    return Caller(name, role, tuple(str(e) for e in events))


@dataclass
class Tokens:
    """Issues, lists, revokes and checks the gateway's bearer tokens."""

    js: JetStreamContext
    subjects: Subjects
    _kv: KeyValue | None = None
    _cache: dict[str, tuple[float, Caller | None]] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(self.subjects.http_tokens_bucket)
        return self._kv

    async def issue(
        self, name: str, role: str, events: list[str] | None = None, *, token: str | None = None
    ) -> str:
        """Store a token for ``name`` (a new random one unless ``token`` is given); returns it.

        Raises:
            ValueError: a bad name, role or pattern, a publisher without patterns, or a
                name that has a token already (revoke it first).
        """
        events = list(events or [])
        if not _NAME.match(name):
            raise ValueError(f"token name {name!r}: letters, digits, '_', '.', '-' (1-64)")
        if role not in TOKEN_ROLES:
            raise ValueError(f"role {role!r}: one of {', '.join(TOKEN_ROLES)}")
        if role == "publisher" and not events:
            raise ValueError("a publisher token needs at least one --events pattern")
        if role != "publisher" and events:
            raise ValueError("only publisher tokens take --events patterns")
        for pattern in events:
            check_pattern(pattern)
        token = token or new_token()
        key = "t." + hash_token(token)
        kv = await self.kv()
        for item in await self.list():
            if item["name"] == name and item["key"] != key:
                raise ValueError(f"a token named {name!r} exists already; revoke it first")
        body = {"name": name, "role": role, "events": events, "created": int(time.time())}
        await kv.put(key, json.dumps(body, sort_keys=True).encode())
        self._cache.pop(key, None)
        return token

    async def list(self) -> list[dict[str, Any]]:
        """Every token's name, role, patterns and creation time (never the token)."""
        kv = await self.kv()
        out = []
        for key, value in (await bucket_values(kv)).items():
            body = (
                bucket_object(self.subjects.http_tokens_bucket, key, value)
                if key.startswith("t.") and value
                else None
            )
            if body is not None and isinstance(body.get("name"), str):
                out.append({**body, "key": key})
        out.sort(key=lambda item: str(item["name"]))
        return out

    async def revoke(self, name: str) -> int:
        """Delete every token named ``name``; returns how many there were."""
        kv = await self.kv()
        gone = 0
        for item in await self.list():
            if item["name"] == name:
                await kv.delete(item["key"])
                self._cache.pop(item["key"], None)
                gone += 1
        return gone

    async def caller(self, token: str, *, max_age: float = _CACHE_S) -> Caller | None:
        """The caller a presented token stands for, or None when it is unknown or revoked
        (as the bucket said at most ``max_age`` seconds ago)."""
        key = "t." + hash_token(token)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < max_age:
            return cached[1]
        kv = await self.kv()
        found: Caller | None = None
        try:
            entry = await kv.get(key)
            body = bucket_object(
                self.subjects.http_tokens_bucket, key, entry.value, entry.revision or 0
            )
            found = _caller(body) if body is not None else None
        except KeyNotFoundError:
            found = None
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = (now, found)
        return found
