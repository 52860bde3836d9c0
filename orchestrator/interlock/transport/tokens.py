"""Per-attempt task tokens: made by the orchestrator at dispatch, echoed by the answer.

A token is base64url(HMAC-SHA256(key, "<capability>\\n<run_id>\\n<action_id>\\n<attempt>")),
with a key only the orchestrator holds (in the secrets bucket).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections import OrderedDict
from typing import Final

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from interlock.transport.logmac import MIN_KEY_BYTES, SecretDamaged
from interlock.transport.subjects import Subjects

TOKEN_KEY: Final = "task-token-key"  # noqa: S105 - the name of a KV key
"""The key, in the secrets bucket, of the HMAC key tokens are made with."""

TOKENS_KEPT = 4_096
"""Tokens made lately, kept to check their answers without computing them again."""


class TaskTokens:
    """Per-attempt task tokens: made at dispatch, checked when the answer comes back.

    The tokens made lately are kept (a bounded number, the oldest forgotten first), so
    checking an answer to one compares it with the token sent instead of computing the
    same HMAC again; any other is computed as before."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError("a task-token key needs at least 16 bytes")
        self._key = key
        self._made: OrderedDict[str, str] = OrderedDict()
        """Token of each attempt made lately, the oldest first."""

    def token(self, capability: str, run_id: str, action_id: str, attempt: int) -> str:
        attempt_of = _attempt_of(capability, run_id, action_id, attempt)
        made = self._made
        token = made.get(attempt_of)
        if token is None:
            token = made[attempt_of] = self._compute(attempt_of)
            if len(made) > TOKENS_KEPT:
                made.popitem(last=False)
        return token

    def _compute(self, attempt_of: str) -> str:
        # One call into OpenSSL (the HMAC object's copy, update and digest are three, in
        # Python): cheaper, even though the key is hashed in again each time.
        digest = hmac.digest(self._key, attempt_of.encode(), "sha256")
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def verify(
        self, token: str, capability: str, run_id: str, action_id: str, attempt: int
    ) -> bool:
        attempt_of = _attempt_of(capability, run_id, action_id, attempt)
        expected = self._made.get(attempt_of) or self._compute(attempt_of)
        return hmac.compare_digest(expected.encode(), token.encode())


_AFTER_NEW_TOKENS = (
    "Tasks dispatched under the old key are answered with tokens it made: those answers "
    "are refused, and the tasks time out and are retried."
)


def _token_key(bucket: str, value: bytes) -> bytes:
    """The task-token key from its stored value (base64 of at least 16 bytes).

    Raises:
        SecretDamaged: it is not one.
    """
    try:
        key = base64.b64decode(value, validate=True)
    except binascii.Error:
        raise SecretDamaged(bucket, TOKEN_KEY, "not base64", _AFTER_NEW_TOKENS) from None
    if len(key) < MIN_KEY_BYTES:
        why = f"{len(key)} bytes, at least {MIN_KEY_BYTES} are needed"
        raise SecretDamaged(bucket, TOKEN_KEY, why, _AFTER_NEW_TOKENS)
    return key


def _attempt_of(capability: str, run_id: str, action_id: str, attempt: int) -> str:
    """The text a token is the HMAC of: the attempt it is for."""
    return f"{capability}\n{run_id}\n{action_id}\n{attempt}"


async def load_token_key(js: JetStreamContext, subjects: Subjects) -> bytes:
    """The installation's task-token key: read from the secrets bucket, or created there
    once (create-only, so replicas starting together agree on one key, and it outlives
    every restart)."""
    kv = await js.key_value(subjects.secrets_bucket)
    for _ in range(3):
        try:
            entry = await kv.get(TOKEN_KEY)
        except KeyNotFoundError:
            pass
        else:
            return _token_key(subjects.secrets_bucket, entry.value or b"")
        key = secrets.token_bytes(32)
        try:
            await kv.create(TOKEN_KEY, base64.b64encode(key))
        except KeyWrongLastSequenceError:
            continue  # another replica created it first: read theirs
        return key
    raise RuntimeError(f"cannot read or create {subjects.secrets_bucket}/{TOKEN_KEY}")
