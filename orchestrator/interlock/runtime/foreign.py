"""Foreign messages: what is found in a run log (or a bucket) that Interlock did not write.

A run-log message whose record MAC does not check out (:mod:`interlock.transport.logmac`),
or that does not decode as records, is foreign: every reader skips it and reports it
here. A :class:`ForeignReport` says each one once per process (a warning, and whatever
the process adds: the orchestrator counts it by stream and dead-letters it, see
``Orchestrator._foreign``), however often the log it is in is read again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client
from nats.js.kv import KeyValue

from interlock.runtime.observe import OrchestratorObserver
from interlock.transport.consuming import dead_letter_data
from interlock.transport.jetstream import jetstream
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects

log = logging.getLogger("interlock.foreign")
orchestrator_log = logging.getLogger("interlock.orchestrator")
"""Where the orchestrator's own dead-lettering of a foreign message is logged."""

COUNTS: Counter[str] = Counter()
"""Foreign messages and bucket values this process found, by stream (each once): the
orchestrator's ``interlock_foreign_messages_total``."""

REASON = "foreign-record"
"""The dead-letter reason of a foreign run-log message."""
SEEN_KEPT = 10_000
"""Foreign messages remembered per process (so each is reported once)."""


@dataclass(frozen=True, slots=True)
class Foreign:
    """One foreign message: where it is and why it is not a record."""

    stream: str
    seq: int
    subject: str
    why: str
    headers: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    data: bytes = field(default=b"", compare=False, hash=False)

    def warning(self) -> str:
        """What ``describe`` says about it."""
        return (
            f"the message at stream sequence {self.seq} of {self.stream} ({self.subject}) "
            f"is not a record Interlock wrote ({self.why}): skipped"
        )


@dataclass
class ForeignReport:
    """Reports each foreign message once: a warning, then ``on_new`` (if any)."""

    on_new: Callable[[Foreign], None] | None = None
    _seen: OrderedDict[tuple[str, int], None] = field(default_factory=OrderedDict)

    def saw(self, found: Foreign) -> None:
        where = (found.stream, found.seq)
        if where in self._seen:
            return
        self._seen[where] = None
        if len(self._seen) > SEEN_KEPT:
            self._seen.popitem(last=False)
        COUNTS[found.stream] += 1
        log.warning("%s", found.warning())
        if self.on_new is not None:
            self.on_new(found)


_VALUES_SEEN: OrderedDict[tuple[str, str, int], None] = OrderedDict()


def foreign_value(
    bucket: str, key: str, why: str, revision: int = 0, *, kept: str = "skipped"
) -> None:
    """Report a bucket value that is not what its writer writes (it is skipped, or what
    ``kept`` says): once per process for each revision of a key."""
    where = (bucket, key, revision)
    if where in _VALUES_SEEN:
        return
    _VALUES_SEEN[where] = None
    if len(_VALUES_SEEN) > SEEN_KEPT:
        _VALUES_SEEN.popitem(last=False)
    COUNTS[f"KV_{bucket}"] += 1
    log.warning(
        "the value of %r in bucket %s is not what Interlock writes there (%s): %s",
        key,
        bucket,
        why,
        kept,
    )


def bucket_object(
    bucket: str, key: str, value: bytes | None, revision: int = 0
) -> dict[str, Any] | None:
    """A bucket value as the JSON object its writer writes, or None (reported, to be
    skipped) when it is not one."""
    try:
        found = json.loads(value or b"")
    except (ValueError, RecursionError):
        found = None
    if isinstance(found, dict):
        return found
    foreign_value(bucket, key, "not a JSON object", revision)
    return None


def bucket_list(bucket: str, key: str, value: bytes | None, revision: int = 0) -> list[Any]:
    """A bucket value as the JSON array its writer writes (an empty one when the key has
    no value); an empty list (reported) when it is not one."""
    if not value:
        return []
    try:
        found = json.loads(value)
    except (ValueError, RecursionError):
        found = None
    if isinstance(found, list):
        return found
    foreign_value(bucket, key, "not a JSON array", revision)
    return []


def index_entry(
    bucket: str, key: str, value: bytes | None, revision: int = 0
) -> dict[str, Any] | None:
    """A run-index value as the orchestrator writes it (an object naming its own run, its
    version a whole number), or None (reported)."""
    found = bucket_object(bucket, key, value, revision)
    if found is None:
        return None
    version = found.get("version", 0)
    if found.get("run_id") != key or type(version) is not int:
        foreign_value(bucket, key, "not a run-index entry", revision)
        return None
    return found


def agent_spec(bucket: str, key: str, value: bytes | None) -> dict[str, Any] | None:
    """An AgentDef's stored spec (an object with a list of capabilities), or None
    (reported)."""
    found = bucket_object(bucket, key, value)
    if found is None:
        return None
    if not isinstance(found.get("capabilities"), list):
        foreign_value(bucket, key, "not an AgentDef (no list of capabilities)")
        return None
    return found


NOT_WRITTEN_HERE = "its stored value is not one Interlock wrote (apply the workflow again)"
"""What a read of a workflow whose stored value is foreign says."""


def entry_object(bucket: str, entry: KeyValue.Entry) -> dict[str, Any] | None:
    """:func:`bucket_object` of a KV entry."""
    return bucket_object(bucket, entry.key, entry.value, entry.revision or 0)


def pointed_version(bucket: str, entry: KeyValue.Entry) -> int | None:
    """The version a workflow's ``latest.`` pointer entry names (None, reported: it is not
    a pointer Interlock wrote)."""
    version = version_of(entry_object(bucket, entry))
    if version is None and entry.value:
        foreign_value(bucket, entry.key, "not a workflow pointer", entry.revision or 0)
    return version


def workflow_body(bucket: str, entry: KeyValue.Entry) -> dict[str, Any] | None:
    """A stored workflow version (an object with its manifest), or None (reported)."""
    body = entry_object(bucket, entry)
    if body is not None and not isinstance(body.get("manifest"), dict):
        foreign_value(bucket, entry.key, "not a stored workflow", entry.revision or 0)
        return None
    return body


def version_of(pointer: dict[str, Any] | None) -> int | None:
    """The version a workflow's ``latest.`` pointer names (None: it names none)."""
    version = None if pointer is None else pointer.get("version")
    return version if type(version) is int and version >= 1 else None


def letter_subject(subjects: Subjects, found: Foreign) -> str:
    """The dead letter of a foreign message: one subject per message, so whether it was
    dead-lettered already is one read."""
    return f"{subjects.dead_letter(REASON)}.{found.stream}.{found.seq}"


async def dead_letter_foreign(nc: Client, subjects: Subjects, found: Foreign) -> bool:
    """Dead-letter ``found`` unless that was done before (by this process before a
    restart, or by another replica): False when it was. Its letter's subject names the
    message (:func:`letter_subject`) and is looked up first; its ``Nats-Msg-Id`` covers
    two replicas finding it at once."""
    subject = letter_subject(subjects, found)
    api = f"{js_api(nc)}.STREAM.MSG.GET.{subjects.dead_letter_stream}"
    reply = json.loads((await nc.request(api, json.dumps({"last_by_subj": subject}).encode())).data)
    if "message" in reply:
        return False
    own = ("nats-", "interlock-dead-letter-")
    headers = {k: v for k, v in found.headers.items() if not k.lower().startswith(own)}
    headers.update(
        {
            "Interlock-Dead-Letter-Reason": REASON,
            "Interlock-Dead-Letter-Detail": found.warning()[:1000],
            "Interlock-Dead-Letter-Subject": found.subject,
            "Nats-Msg-Id": f"{REASON}.{found.stream}.{found.seq}",
        }
    )
    data = dead_letter_data(found.data, headers, nc.max_payload)
    await jetstream(nc).publish(subject, data, headers=headers)
    return True


class ForeignDeadLetters:
    """What the run logs' reads tell of each foreign message they find: this process
    dead-letters it (reported once per process), unless that was done before."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        observer: OrchestratorObserver,
        counters: Counter[str],
        stopping: asyncio.Event,
    ) -> None:
        self.nc, self.subjects, self.observer = nc, subjects, observer
        self.counters, self._stopping = counters, stopping
        self._background: set[asyncio.Task[None]] = set()

    def report(self) -> ForeignReport:
        """The report a :class:`RunLog` tells of each foreign message it finds."""
        return ForeignReport(on_new=self._found)

    def _found(self, found: Foreign) -> None:
        if self._stopping.is_set():
            return
        task = asyncio.get_running_loop().create_task(self._dead_letter(found))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _dead_letter(self, found: Foreign) -> None:
        try:
            if await dead_letter_foreign(self.nc, self.subjects, found):
                self.counters[f"dead_lettered:{REASON}"] += 1
                self.observer.dead_lettered(REASON)
        # It is still skipped by every reader; a later process dead-letters it.
        except Exception as exc:  # noqa: BLE001
            orchestrator_log.warning(
                "could not dead-letter the foreign message %s: %s", found.seq, exc
            )
