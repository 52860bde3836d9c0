"""Run-log messages authenticated: an HMAC of each, in a header, under the log key.

Every message appended to a run log carries ``Interlock-Record-Mac``: base64url (no
padding) of HMAC-SHA256(log key, ``<subject>\\n<payload>``), where ``<subject>`` is the run
log's subject (``<prefix>.runs.<run id>``) and ``<payload>`` the message's bytes (the JSON
array of the decision's CloudEvents). Nothing else is covered: not the other headers, not
the stream sequence. A reader takes a message as a record only when its MAC checks out;
any other message on the subject (a JetStream acknowledgement reflected there, a value
someone published) is foreign: skipped and reported, never folded.

The log key lives in the secrets bucket under ``shared.log-key``, with the stream sequence
of the run logs when it was made (``signed_after``): messages at or before it were written
before the key existed and are read as records when they decode as records (so logs kept
from before the MAC still read, and so do logs written under a key that was lost and made
again); every message after it needs its MAC. The key is made once (create-only, by
whichever writer of run logs needs it first: the orchestrator, the CLI or the gateway) and
is read by those three roles only (``interlock.auth.roles``). The secrets bucket refuses a
second value for a key (``discard_new_per_subject``, no rollups): neither the key nor its
``signed_after`` can be changed by a publish, and a damaged one is reported
(:class:`SecretDamaged`) with how to restore it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Final

import nats.errors
from nats.aio.client import Client

from interlock.core.vocabulary import InterlockError
from interlock.transport.jetstream import jetstream
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects

LOG_KEY: Final = "shared.log-key"
"""The key, in the secrets bucket, of the run-log key. Keys of one word there are the
orchestrator's alone; ``shared.`` keys are read by the other writers of run logs too."""
MAC_HEADER: Final = "Interlock-Record-Mac"
"""The header of a run-log message that holds its MAC."""
KEY_BYTES: Final = 32
MIN_KEY_BYTES: Final = 16
_TIMEOUT = 5.0
_WRONG_LAST_SEQUENCE = 10071
_STREAM_NOT_FOUND = 10059
_NOT_ANSWERED = (
    "the log key ({bucket}/" + LOG_KEY + ") was not answered in time: a credential issued "
    "before run logs were authenticated may not read it (issue it again), or the server is busy"
)


class SecretDamaged(InterlockError):
    """A secret in the secrets bucket is not what Interlock writes there (not base64, too
    short, not the JSON it should be). Says which, why, and how to restore it."""

    def __init__(self, bucket: str, key: str, why: str, consequence: str) -> None:
        self.bucket, self.key, self.why = bucket, key, why
        stream = f"KV_{bucket}"
        super().__init__(
            f"the secret {bucket}/{key} is damaged ({why}). Restore it from a backup "
            f'(nats kv put {bucket} {key} "$(cat BACKUP)", after the purge below), or '
            f"remove it with the orchestrator's credential, "
            f"nats stream purge {stream} --subject '$KV.{bucket}.{key}' --force, "
            f"and start the orchestrator again: a new one is made. {consequence}"
        )


class LogKeyUnavailable(InterlockError):
    """The log key cannot be read or made: no secrets bucket yet, or a credential that may
    not read it (issued before the log key existed)."""


@dataclass(frozen=True, slots=True)
class LogKey:
    """The installation's run-log key and the stream sequence it signs after."""

    key: bytes
    signed_after: int
    """Run-log messages at or before this stream sequence predate the key."""
    _keyed: hmac.HMAC = field(init=False, repr=False, compare=False)
    """The HMAC with the key taken in: each MAC starts from a copy of it (cheaper than
    ``hmac.digest``, which hashes the key in again each time, and copies no payload)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_keyed", hmac.new(self.key, digestmod=hashlib.sha256))

    def mac(self, subject: str, payload: bytes) -> str:
        """The ``Interlock-Record-Mac`` of ``payload`` appended on ``subject``."""
        h = self._keyed.copy()
        h.update(subject.encode() + b"\n")
        h.update(payload)
        return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()

    def refusal(self, subject: str, headers: dict[str, str] | None, payload: bytes) -> str | None:
        """Why a message on ``subject`` is not an authenticated record (None: it is one).
        Messages at or before ``signed_after`` are not asked: they predate the key."""
        given = (headers or {}).get(MAC_HEADER)
        if given is None:
            return "it carries no record MAC"
        if not hmac.compare_digest(given.encode(), self.mac(subject, payload).encode()):
            return "its record MAC does not check out"
        return None


def encode_log_key(key: LogKey) -> bytes:
    return json.dumps(
        {"key": base64.b64encode(key.key).decode(), "signed_after": key.signed_after}
    ).encode()


LOG_KEY_LOST = (
    "Without the old key, the run logs written so far are read as logs from before the "
    "key (each message checked only as records); back the new one up."
)


def decode_log_key(bucket: str, value: bytes) -> LogKey:
    """The log key from its stored value.

    Raises:
        SecretDamaged: the value is not what :func:`encode_log_key` writes.
    """

    def damaged(why: str) -> SecretDamaged:
        return SecretDamaged(bucket, LOG_KEY, why, LOG_KEY_LOST)

    try:
        found: Any = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        raise damaged("not JSON") from None
    if not isinstance(found, dict):
        raise damaged("not a JSON object")
    after, text = found.get("signed_after"), found.get("key")
    if type(after) is not int or after < 0:
        raise damaged("signed_after is not a whole number")
    if not isinstance(text, str):
        raise damaged("no key")
    try:
        key = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise damaged("the key is not base64") from None
    if len(key) < MIN_KEY_BYTES:
        raise damaged(f"the key has {len(key)} bytes, at least {MIN_KEY_BYTES} are needed")
    return LogKey(key, after)


async def load_log_key(nc: Client, subjects: Subjects) -> LogKey:
    """The installation's log key: read from the secrets bucket (by a direct get of its
    one subject, what the operator's and the gateway's credentials may read), or made
    there once (create-only: writers starting together agree on one key).

    Raises:
        SecretDamaged: the stored value is not a log key.
        LogKeyUnavailable: the secrets bucket does not exist or does not answer.
    """
    bucket = subjects.secrets_bucket
    subject = f"$KV.{bucket}.{LOG_KEY}"
    for _ in range(3):
        found = await _read(nc, bucket, subject)
        if found is not None:
            return decode_log_key(bucket, found)
        made = LogKey(secrets.token_bytes(KEY_BYTES), await _runs_last_seq(nc, subjects))
        try:
            ack = await jetstream(nc).request_ack(
                subject,
                encode_log_key(made),
                headers={"Nats-Expected-Last-Subject-Sequence": "0"},
                ack_wait=_TIMEOUT,
            )
        except nats.errors.NoRespondersError:
            raise LogKeyUnavailable(f"no secrets bucket {bucket}: provision first") from None
        except nats.errors.TimeoutError:
            raise LogKeyUnavailable(_NOT_ANSWERED.format(bucket=bucket)) from None
        reply = json.loads(ack.data)
        error = reply.get("error")
        if error is None:
            return made
        if error.get("err_code") != _WRONG_LAST_SEQUENCE:
            raise LogKeyUnavailable(f"cannot make the log key in {bucket}: {error}")
        # Another writer made it first: read theirs.
    raise LogKeyUnavailable(f"cannot read or make {bucket}/{LOG_KEY}")


async def _read(nc: Client, bucket: str, subject: str) -> bytes | None:
    try:
        msg = await nc.request(
            f"{js_api(nc)}.DIRECT.GET.KV_{bucket}.{subject}", b"", timeout=_TIMEOUT
        )
    except nats.errors.NoRespondersError:
        raise LogKeyUnavailable(f"no secrets bucket {bucket}: provision first") from None
    except nats.errors.TimeoutError:
        raise LogKeyUnavailable(_NOT_ANSWERED.format(bucket=bucket)) from None
    headers = msg.headers or {}
    status = headers.get("Status")
    if status == "404":
        return None
    if status:
        raise LogKeyUnavailable(f"reading {bucket}/{LOG_KEY}: status {status}")
    if headers.get("KV-Operation") in ("DEL", "PURGE"):
        return None
    return msg.data


async def _runs_last_seq(nc: Client, subjects: Subjects) -> int:
    """The run logs' last stream sequence (0: no run-log stream yet)."""
    try:
        msg = await nc.request(
            f"{js_api(nc)}.STREAM.INFO.{subjects.runs_stream}", b"", timeout=_TIMEOUT
        )
    except nats.errors.NoRespondersError:
        return 0
    reply = json.loads(msg.data)
    error = reply.get("error")
    if error is not None:
        if error.get("err_code") == _STREAM_NOT_FOUND:
            return 0
        raise LogKeyUnavailable(f"reading {subjects.runs_stream}'s info: {error}")
    return int(reply.get("state", {}).get("last_seq", 0))
