"""Shared fixtures: one real nats-server per test session (or ``NATS_URL``), isolated by prefix.

Every test gets its own subject prefix (``subjects``), so streams, buckets and subjects of
different tests never collide on the shared server.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from hypothesis import HealthCheck, settings
from nats.aio.client import Client
from nats.js import JetStreamContext

from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.subjects import Subjects

# Property tests check behaviour, not speed: on a shared machine generating inputs can be
# slow, and a health check or deadline tripping on that says nothing about the code.
settings.register_profile("interlock", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("interlock")

# `interlock dev` records where it serves for the CLI (interlock.auth.dev.context_file):
# the tests' runs of it record in a folder of their own, never in the user's, even where a
# test starts a process without the INTERLOCK_* variables (XDG_CONFIG_HOME then).
_CONTEXT_DIR = tempfile.mkdtemp(prefix="interlock-ctx-")
os.environ["INTERLOCK_CONTEXT"] = os.path.join(_CONTEXT_DIR, "dev.json")
os.environ["XDG_CONFIG_HOME"] = _CONTEXT_DIR


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a NATS server with JetStream: ``$NATS_URL``, else a fresh local nats-server."""
    url = os.environ.get("NATS_URL")
    if url:
        yield url
        return
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    """A connected client, drained-and-closed after the test."""
    from support.accounts import admin_creds

    client = await nats.connect(
        nats_url,
        connect_timeout=5,
        max_reconnect_attempts=0,
        user_credentials=admin_creds(nats_url),
    )
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    """A JetStream context on ``nc``."""
    return nc.jetstream()


@pytest.fixture
def subjects() -> Subjects:
    """Names under a prefix unique to this test."""
    return Subjects(prefix=f"t{uuid.uuid4().hex[:12]}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of support.suite_order.LONGEST_FIRST ahead of the others, in its order;
    the tests of a module, and the other modules, in the order collected (a stable sort).

    Before tests are deselected by mark: a test marked ``serial`` in a module whose text
    does not say ``mark.serial`` stops the run, as `make test` finds the modules of its
    serial part by that text (collecting only them, not the whole suite a second time)."""
    from support.suite_order import LONGEST_FIRST

    hidden = sorted(
        {
            item.nodeid.split("::", 1)[0]
            for item in items
            if item.get_closest_marker("serial") is not None
            and "mark.serial" not in item.path.read_text(encoding="utf-8")
        }
    )
    if hidden:
        raise pytest.UsageError(
            f"{hidden}: tests marked serial in a module without the text mark.serial, "
            "which the Makefile looks for to run them (write pytest.mark.serial there)"
        )
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
