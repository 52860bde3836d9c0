"""The core reads no clock, draws no random number and imports no I/O library."""

from __future__ import annotations

import datetime as dt
import json
import os
import pkgutil
import random
import subprocess
import sys
import time
import uuid
from typing import Any, NoReturn

import pytest

import interlock.core
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.state import encode_state, fold
from support.core import ROOT, Run


def _forbidden(*_: Any, **__: Any) -> NoReturn:
    raise AssertionError("the core must not read a clock or draw randomness")


class _NoNowDatetime(dt.datetime):
    @classmethod
    def now(cls, tz: Any = None) -> NoReturn:  # type: ignore[override]
        _forbidden()

    @classmethod
    def utcnow(cls) -> NoReturn:  # type: ignore[override]
        _forbidden()

    @classmethod
    def today(cls) -> NoReturn:  # type: ignore[override]
        _forbidden()


class _NoTodayDate(dt.date):
    @classmethod
    def today(cls) -> NoReturn:  # type: ignore[override]
        _forbidden()


def _forbid_clock_and_randomness(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "localtime"):
        monkeypatch.setattr(time, name, _forbidden)
    for name in ("random", "randint", "randrange", "choice", "getrandbits", "uniform", "shuffle"):
        monkeypatch.setattr(random, name, _forbidden)
    for name in ("uuid1", "uuid4"):
        monkeypatch.setattr(uuid, name, _forbidden)
    monkeypatch.setattr(os, "urandom", _forbidden)
    monkeypatch.setattr(dt, "datetime", _NoNowDatetime)
    monkeypatch.setattr(dt, "date", _NoTodayDate)
    # Modules that imported the classes by name hold the originals: swap those too.
    for module in list(sys.modules.values()):
        if module is None or not module.__name__.startswith("interlock.core"):
            continue
        for attr, original, stand_in in (
            ("datetime", dt.datetime, _NoNowDatetime),
            ("date", dt.date, _NoTodayDate),
        ):
            if getattr(module, attr, None) is original:
                monkeypatch.setattr(module, attr, stand_in)


def _whole_runs() -> bytes:
    """Compile the example, run it three ways (merged, guard failure, cancelled); all bytes."""
    workflow = (ROOT / "examples/code-review.yaml").read_text()
    agents = (ROOT / "examples/agents.yaml").read_text()
    compiled = compile_sources([("w.yaml", workflow)], agent_sources=[("a.yaml", agents)])
    assert compiled.ok, compiled.diagnostics
    out: list[bytes] = []
    for plan in ("merged", "guard", "cancel"):
        run = Run(compiled.workflows[0], run_id=f"r-{plan}")
        run.start({"repository": "a/b", "pr": 3})
        run.answer({"score": 6, "summary": "meh"})
        run.answer({"message": "fixed"})
        run.answer({"score": 9, "summary": "good"})
        if plan == "guard":
            run.send("approval.granted", {"by": "nobody"}, event_id="h1")
        if plan == "cancel":
            run.cancel("stop")
        else:
            run.send("approval.granted", {"approver": "alice"}, event_id="h2")
            run.answer({"message": "merged"})
        assert encode_state(fold(run.log)) == encode_state(run.state)
        out.extend(ev.encode(r) for r in run.log)
        out.append(encode_state(run.state))
    return b"\n".join(out)


def test_the_core_reads_no_clock_and_no_randomness() -> None:
    expected = _whole_runs()
    with pytest.MonkeyPatch.context() as monkeypatch:
        _forbid_clock_and_randomness(monkeypatch)
        with pytest.raises(AssertionError, match="must not read a clock"):
            time.time()
        with pytest.raises(AssertionError, match="must not read a clock"):
            dt.datetime.now(dt.UTC)
        guarded = _whole_runs()
    assert b'"status":"completed"' in guarded
    assert b"io.interlock.guard.failed" in guarded
    assert b'"status":"cancelled"' in guarded
    assert guarded == expected


def test_the_core_imports_no_io_or_telemetry() -> None:
    code = """
import importlib, json, pkgutil, sys
import interlock.core
for module in pkgutil.iter_modules(interlock.core.__path__):
    importlib.import_module("interlock.core." + module.name)
banned = {"nats", "asyncio", "opentelemetry", "prometheus_client"}
print(json.dumps({
    "loaded": sorted(m for m in sys.modules if m.startswith("interlock.")),
    "banned": sorted(m for m in sys.modules if m.split(".")[0] in banned),
}))
"""
    result = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT / "tests",
        timeout=60,
    )
    found = json.loads(result.stdout)
    assert found["banned"] == []
    modules = {m.name for m in pkgutil.iter_modules(interlock.core.__path__)}
    assert {f"interlock.core.{m}" for m in modules} <= set(found["loaded"])
    assert not [m for m in found["loaded"] if m.startswith(("interlock.runtime", "interlock.sdk"))]
