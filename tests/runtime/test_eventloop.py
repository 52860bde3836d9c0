"""The event loop of the long-running processes: uvloop where installed, the standard loop
on request, a clear error for a loop that is unknown."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from interlock.runtime import eventloop
from support.runtime import cli_env, run_cli


async def _running_loop() -> str:
    return eventloop.loop_name(asyncio.get_running_loop())


def test_asyncio_asks_for_the_standard_loop() -> None:
    assert eventloop.loop_factory("asyncio") is None
    assert eventloop.loop_factory(" AsyncIO ") is None


def test_uvloop_is_taken_by_default_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(eventloop.EVENT_LOOP_ENV, raising=False)
    assert eventloop.run(_running_loop()) == "uvloop"
    monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "asyncio")
    assert eventloop.run(_running_loop()) == "asyncio"
    monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "uvloop")
    assert eventloop.run(_running_loop()) == "uvloop"


def test_an_unknown_loop_is_refused_and_the_coroutine_not_left_unawaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "tokio")
    main = _running_loop()
    with pytest.raises(eventloop.EventLoopError, match="INTERLOCK_EVENT_LOOP must be one of"):
        eventloop.run(main)
    assert main.cr_frame is None  # closed: no "never awaited" warning


def test_uvloop_insisted_on_but_missing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails
    with pytest.raises(eventloop.EventLoopError, match="uvloop is not installed"):
        eventloop.loop_factory("uvloop")
    assert eventloop.loop_factory("auto") is None


def test_serve_with_an_unknown_loop_exits_2_without_a_traceback() -> None:
    done = run_cli(
        "serve",
        "--metrics-port",
        "0",
        env=cli_env("nats://127.0.0.1:1", "il", INTERLOCK_EVENT_LOOP="x"),
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "INTERLOCK_EVENT_LOOP must be one of auto, uvloop, asyncio, got 'x'" in done.stderr
    assert "Traceback" not in done.stderr


async def _collector() -> tuple[int, int]:
    return gc.get_threshold()[0], gc.get_freeze_count()


def test_the_collector_is_tuned_while_the_loop_runs_and_restored_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = gc.get_threshold()
    monkeypatch.delenv(eventloop.GC_ENV, raising=False)
    threshold, frozen = eventloop.run(_collector())
    assert threshold == eventloop.GC_THRESHOLD
    assert frozen > 0  # what existed at the start is out of the collector's work
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    monkeypatch.setenv(eventloop.GC_ENV, "5000")
    assert eventloop.run(_collector())[0] == 5000
    monkeypatch.setenv(eventloop.GC_ENV, "0")  # Python's own settings
    assert eventloop.run(_collector()) == (before[0], 0)


@pytest.mark.parametrize("raw", ["-1", "lots", "1.5"])
def test_a_bad_collector_threshold_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(eventloop.GC_ENV, raw)
    main = _collector()
    with pytest.raises(eventloop.EventLoopError, match="INTERLOCK_GC_THRESHOLD must be"):
        eventloop.run(main)
    assert main.cr_frame is None
