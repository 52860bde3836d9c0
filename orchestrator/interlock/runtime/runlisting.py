"""The run index's listing keys, and pages of runs read from them by the server.

Each run has, beside its entry (key ``<run id>``), one listing key in the same bucket,
``L.<status>.<namespace>.<workflow>.<run id>``, written when the entry first takes that
status, namespace and workflow, and removed (purged: no marker is left) once it moves to
another. A subject filter selects the runs of a status and/or a workflow
(``L.failed.*.hello.*``), and the stream keeps them in the order they were written: the
newest listed last. A page is read back from the newest down without reading what lies
before it:

- the newest listing key under the filter is asked for (a direct get ``last_by_subj``),
  then the stream is read back in windows of stream sequences below it, each by batched
  direct gets of the keys the filter selects (the server skips the others); a window
  that holds few matches makes the next one four times as wide (a rare status, a quiet
  workflow), up to :data:`WINDOW`;
- the entries the keys name are read in one ``multi_last`` direct get per
  :data:`CHUNK`, and checked against the listing (a listing left behind by a writer that
  stopped between its two writes names a run whose entry says otherwise: it is skipped).
  An ``offset`` is skipped in the keys, their entries never read.

Nothing is kept between pages: memory is a page's, whatever the count of runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError

from interlock.runtime.foreign import index_entry
from interlock.transport.jetstream import jetstream
from interlock.transport.kvread import bucket_values
from interlock.transport.natsclient import js_api
from interlock.transport.subjects import Subjects

PREFIX = "L"
"""The first token of every listing key."""
BACKFILLED = "L.backfilled"
"""Set once every entry of the bucket has its listing key (see :func:`backfill`)."""
CHUNK = 200
"""Entries read at once while a page is filled."""
WINDOW = 16_384
"""The most stream sequences looked at in one step back (a sparse filter's)."""
_BATCH = 1000
_TIMEOUT = 5.0
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_LISTED = re.compile(r"L\.[^.]+\.[^.]+\.[^.]+\.[^.]+$")
"""A listing key (not an entry, not :data:`BACKFILLED`)."""


def listing_key(entry: Mapping[str, Any]) -> str | None:
    """The listing key of a run-index entry (None: it names no workflow or status yet)."""
    parts = (
        entry.get("status"),
        entry.get("namespace") or "default",
        entry.get("workflow"),
        entry.get("run_id"),
    )
    if not all(isinstance(p, str) and _TOKEN.fullmatch(p) for p in parts):
        return None
    return ".".join((PREFIX, *parts))  # type: ignore[arg-type]


def listing_filter(workflow: str | None = None, status: str | None = None) -> str:
    """The listing keys of ``workflow`` (``name`` or ``namespace/name``) and ``status``."""
    namespace, name = "*", "*"
    if workflow:
        namespace, _, name = workflow.rpartition("/")
        namespace = namespace or "*"
    return f"{PREFIX}.{status or '*'}.{namespace}.{name}.*"


async def put_entry(nc: Client, subjects: Subjects, entry: Mapping[str, Any]) -> None:
    """Write a run-index entry and its listing key as the relay does (no compare-and-set):
    for a backfill and for filling an index by hand."""
    js = jetstream(nc)
    bucket = subjects.runs_bucket
    key = listing_key(entry)
    if key is not None:
        await js.publish(f"$KV.{bucket}.{key}", b"{}")
    await js.publish(f"$KV.{bucket}.{entry['run_id']}", json.dumps(dict(entry)).encode())


async def put_entries(nc: Client, subjects: Subjects, entries: list[Mapping[str, Any]]) -> None:
    """:func:`put_entry` of each, sent at once in order (each listing key just before its
    entry, as the relay writes them), the acknowledgements awaited together."""
    js = jetstream(nc)
    bucket = subjects.runs_bucket
    writes: list[Awaitable[Any]] = []
    for entry in entries:
        key = listing_key(entry)
        if key is not None:
            writes.append(js.publish(f"$KV.{bucket}.{key}", b"{}"))
        body = json.dumps(dict(entry)).encode()
        writes.append(js.publish(f"$KV.{bucket}.{entry['run_id']}", body))
    await asyncio.gather(*writes)


Keep = Callable[[list[dict[str, Any]]], Awaitable[list[Any]]]


class RunPages:
    """Pages of the run index, newest listed first, read by direct gets (no consumer)."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._nc = nc
        self._bucket = subjects.runs_bucket
        self._prefix = f"$KV.{self._bucket}."
        self._api = f"{js_api(nc)}.DIRECT.GET.KV_{self._bucket}"
        self._info = f"{js_api(nc)}.STREAM.INFO.KV_{self._bucket}"

    async def page(
        self,
        *,
        workflow: str | None = None,
        status: str | None = None,
        offset: int = 0,
        limit: int = 50,
        keep: Keep | None = None,
    ) -> tuple[list[Any], bool]:
        """Up to ``limit`` runs after the first ``offset``, newest listed first, and
        whether more follow. ``keep`` narrows each chunk of entries read (and may turn
        them into something else); without it, the ``offset`` is skipped uncounted."""
        subject = self._prefix + listing_filter(workflow, status)
        # Windows are read whole, by sequence, and the keys matched here while that finds
        # enough of them: the server matching a wildcard per message grew with the index
        # (200 ms for 100 messages at 1,000,000 runs, against 2 ms unfiltered). A window
        # with few matches (a rare status, a quiet workflow) hands the filter to the
        # server from then on, which skips what does not match.
        matches = re.compile(
            re.escape(listing_filter(workflow, status)).replace(r"\*", "[^.]+") + "$"
        ).match
        scan: str | None = None
        try:
            below = await self._newest(subject)
        except nats.errors.NoRespondersError:
            return [], False  # no run index yet
        if below is None:
            return [], False
        below += 1  # the matches below this stream sequence are still to be read
        # Without ``keep`` the offset is skipped in the keys, their entries never read.
        skip, offset = (offset, 0) if keep is None else (0, offset)
        need = offset + limit + 1
        window = max(64, 2 * (skip + need))
        keys: list[str] = []
        out: list[Any] = []
        while len(out) < need:
            if not keys:
                if below <= 1:
                    break
                start = max(1, below - window)
                keys = [k for k in await self._read(scan, start, below) if matches(k)]
                below = start
                if len(keys) < window // 32:  # rare: the server skips what does not match
                    scan = subject
                if len(keys) < window // 8:  # sparse here: look further back at once
                    window = min(window * 4, WINDOW)
                dropped = min(skip, len(keys))
                keys, skip = keys[dropped:], skip - dropped
                continue
            chunk, keys = keys[:CHUNK], keys[CHUNK:]
            entries = await self._entries(chunk)
            out += await keep(entries) if keep is not None else entries
        return out[offset : offset + limit], len(out) > offset + limit

    async def count(self, workflow: str | None = None, status: str | None = None) -> int:
        """How many listing keys match (the server counts them)."""
        found = await self._count_from(self._prefix + listing_filter(workflow, status), 1)
        return found[0]

    # -- the server's answers ------------------------------------------------------------

    async def _newest(self, subject: str) -> int | None:
        """The stream's last sequence (None: empty): one request, whatever it holds (the
        newest key under a wildcard filter costs the server in proportion to the keys)."""
        info = await self._nc.request(self._info, b"", timeout=_TIMEOUT)
        if (info.headers or {}).get("Status") == "503":
            raise nats.errors.NoRespondersError
        found = json.loads(info.data)
        if "error" in found:
            if found["error"].get("err_code") == 10059:  # stream not found
                raise nats.errors.NoRespondersError
            raise RuntimeError(f"reading the run index: {found['error']}")
        last = int(found.get("state", {}).get("last_seq", 0))
        return last or None

    async def _count_from(self, subject: str, seq: int) -> tuple[int, int]:
        """How many messages on ``subject`` are at ``seq`` or after, and the first one's
        sequence (0 when none)."""
        found = await self._get({"seq": seq, "next_by_subj": subject, "batch": 1})
        if found is None:
            return 0, 0
        return found[1] + 1, found[0]

    async def _read(self, subject: str | None, start: int, below: int) -> list[str]:
        """The listing keys (under ``subject``; None: every message read) from stream
        sequence ``start`` to before ``below``, newest first (at most ``below - start``:
        a window of the stream)."""
        keys: list[str] = []
        seq, plen = start, len(self._prefix)
        while seq < below:
            batch = min(_BATCH, below - seq)
            request: dict[str, Any] = {"seq": seq, "batch": batch}
            if subject is not None:
                request["next_by_subj"] = subject
            got = await self._batch(request)
            keys += [
                subj[len(self._prefix) :]
                for at, subj, _ in got
                if at < below and subj.startswith(self._prefix) and _LISTED.match(subj, plen)
            ]
            if len(got) < batch or got[-1][0] >= below - 1:
                break
            seq = got[-1][0] + 1
        keys.reverse()
        return keys

    async def _entries(self, keys: list[str]) -> list[dict[str, Any]]:
        """The entries the listing ``keys`` name, in that order: those still listed under
        that key only (a listing left behind names a run whose entry says otherwise)."""
        if not keys:
            return []
        run_ids = [k.rsplit(".", 1)[1] for k in keys]
        request = {"multi_last": [self._prefix + r for r in run_ids], "batch": len(run_ids)}
        by_id: dict[str, dict[str, Any]] = {}
        for seq, subj, data in await self._batch(request):
            key = subj[len(self._prefix) :]
            item = index_entry(self._bucket, key, data, seq) if data else None
            if item is not None:
                by_id[key] = item
        return [
            item
            for key, run_id in zip(keys, run_ids, strict=True)
            if (item := by_id.get(run_id)) is not None and listing_key(item) == key
        ]

    async def _get(self, request: dict[str, Any]) -> tuple[int, int] | None:
        """One message's (sequence, matches after it), None for none."""
        msg = await self._nc.request(self._api, json.dumps(request).encode(), timeout=_TIMEOUT)
        headers = msg.headers or {}
        status = headers.get("Status")
        if status == "404":
            return None
        if status:
            raise RuntimeError(f"reading the run index: status {status}")
        return int(headers["Nats-Sequence"]), int(headers.get("Nats-Num-Pending", "0"))

    async def _batch(self, request: dict[str, Any]) -> list[tuple[int, str, bytes]]:
        """A batched direct get's messages (markers of deleted keys left out), collected
        by the subscription's callback and woken once, at the server's end-of-batch
        notice (see :mod:`interlock.transport.directget`)."""
        out: list[tuple[int, str, bytes]] = []
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def collect(msg: Msg) -> None:
            if ended.done():
                return
            headers = msg.headers or {}
            status = headers.get("Status")
            if status in ("204", "404"):
                ended.set_result(None)
            elif status:
                ended.set_exception(RuntimeError(f"reading the run index: status {status}"))
            elif headers.get("KV-Operation") not in ("DEL", "PURGE"):
                seq = int(headers["Nats-Sequence"])
                out.append((seq, headers.get("Nats-Subject", ""), msg.data))

        sub = await self._nc.subscribe(self._nc.new_inbox(), cb=collect)
        try:
            await self._nc.publish(self._api, json.dumps(request).encode(), reply=sub.subject)
            await asyncio.wait_for(ended, _TIMEOUT)
        except TimeoutError:
            raise nats.errors.TimeoutError from None
        finally:
            await sub.unsubscribe()
        return out


async def backfill(nc: Client, subjects: Subjects) -> int:
    """Give every entry of the run index its listing key, once per bucket (an index
    written before listing keys were): how many were written. Reads the bucket's entries
    once; a start after the first finds :data:`BACKFILLED` and reads nothing."""
    js = jetstream(nc)
    kv = await js.key_value(subjects.runs_bucket)
    with contextlib.suppress(KeyNotFoundError):
        await kv.get(BACKFILLED)
        return 0
    written: list[Awaitable[Any]] = []
    count = 0
    for key, value in (await bucket_values(kv, "*")).items():
        item = index_entry(subjects.runs_bucket, key, value)
        listed = listing_key(item) if item is not None else None
        if listed is not None:
            written.append(js.publish(f"$KV.{subjects.runs_bucket}.{listed}", b"{}"))
            count += 1
        if len(written) >= 256:  # acknowledgements awaited a few hundred at a time
            await asyncio.gather(*written)
            written.clear()
    await asyncio.gather(*written)
    await kv.put(BACKFILLED, b"{}")
    return count
