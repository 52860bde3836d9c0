"""The tracer of ``python -m bench steps``: what a process reads and writes on its sockets, timed.

``python -m bench steps`` puts this directory on ``PYTHONPATH`` of the processes it starts
(``bench/peers/interlock_bench.py``, which passes it on to ``interlock serve`` and
``interlock agent run``), with ``BENCH_STEPS_OUT`` naming a directory. Nothing of Interlock
imports it. In the driver (``interlock_bench.py``), the orchestrator (``interlock serve``)
and the worker (``interlock agent run``), and only there, it wraps asyncio's
``StreamReader.read`` (each chunk a NATS connection reads) and ``StreamWriter.write`` /
``writelines`` (each chunk it writes): one ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, one
clock for every process of the machine) and one list append per call, the bytes kept by
reference. At exit it writes them to ``BENCH_STEPS_OUT/<role>-<pid>.trace``, unparsed:
``bench/steps_bench.py`` finds the NATS protocol's messages in them.

``BENCH_STEPS_WRAP="module:Class.function,module:function"`` also times each call of those
functions (entry and return; a coroutine function's return is when its await ends), wrapped
once their module is imported. A name that is not there is reported (on stderr and in the
trace) and left out: the rest is traced all the same.

Trace file: records, each a line ``<ns> <kind> <stream> <length>`` then ``<length>`` bytes:
kind ``r`` a chunk read, ``w`` a chunk written (``stream`` tells connections apart), ``>``
and ``<`` a wrapped function's entry and return (the bytes are its name), ``i`` a note.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _role() -> str | None:
    argv = getattr(sys, "argv", None) or [""]
    head = os.path.basename(argv[0])
    if head == "interlock_bench.py":
        return "driver"
    if head == "interlock" and argv[1:2] == ["serve"]:
        return "orchestrator"
    if head == "interlock" and argv[1:3] == ["agent", "run"]:
        return "worker"
    return None


def _install(out: str, role: str) -> None:
    import atexit
    import functools
    import inspect
    import time
    from asyncio import streams

    now = time.perf_counter_ns
    trace: list[tuple[int, str, int, Any]] = []
    append = trace.append
    notes: list[str] = []

    def note(text: str, say: bool = True) -> None:
        notes.append(text)
        if say:
            sys.stderr.write(f"bench steps tracer ({role}): {text}\n")

    reader_read = streams.StreamReader.read
    writer_write = streams.StreamWriter.write
    writer_writelines = streams.StreamWriter.writelines

    async def read(self: streams.StreamReader, n: int = -1) -> bytes:
        data = await reader_read(self, n)
        append((now(), "r", id(self), data))
        return data

    def write(self: streams.StreamWriter, data: bytes | bytearray | memoryview) -> None:
        append((now(), "w", id(self), data if type(data) is bytes else bytes(data)))
        writer_write(self, data)

    def writelines(self: streams.StreamWriter, data: Any) -> None:
        chunks = tuple(data)
        append((now(), "w", id(self), chunks))  # joined at exit
        writer_writelines(self, chunks)

    setattr(streams.StreamReader, "read", read)  # noqa: B010 - a method replaced
    setattr(streams.StreamWriter, "write", write)  # noqa: B010
    setattr(streams.StreamWriter, "writelines", writelines)  # noqa: B010
    note("traced: asyncio.StreamReader.read, StreamWriter.write, StreamWriter.writelines", False)

    wanted: dict[str, list[str]] = {}
    for spec in os.environ.get("BENCH_STEPS_WRAP", "").split(","):
        spec = spec.strip()
        if not spec:
            continue
        module, _, attr = spec.partition(":")
        if not attr:
            note(f"not wrapped: {spec!r} (want module:Class.function)")
            continue
        wanted.setdefault(module, []).append(attr)
    applied: set[str] = set()

    def timed(function: Any, name: str) -> Any:
        label = name.encode()
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                append((now(), ">", 0, label))
                try:
                    return await function(*args, **kwargs)
                finally:
                    append((now(), "<", 0, label))

            return timed_async

        @functools.wraps(function)
        def timed_sync(*args: Any, **kwargs: Any) -> Any:
            append((now(), ">", 0, label))
            try:
                return function(*args, **kwargs)
            finally:
                append((now(), "<", 0, label))

        return timed_sync

    def wrap_in(module_name: str, module: Any) -> None:
        for attr in wanted.get(module_name, ()):
            spec = f"{module_name}:{attr}"
            parts = attr.split(".")
            owner: Any = module
            try:
                for part in parts[:-1]:
                    owner = getattr(owner, part)
                function = getattr(owner, parts[-1])
            except AttributeError:
                note(f"not wrapped: {spec} (no such name)")
                continue
            note(f"wrapped: {spec}", say=False)
            wrapped = timed(function, attr)
            raw = owner.__dict__.get(parts[-1]) if isinstance(owner, type) else None
            if isinstance(raw, staticmethod):
                wrapped = staticmethod(wrapped)
            elif isinstance(raw, classmethod):
                wrapped = classmethod(timed(raw.__func__, attr))
            setattr(owner, parts[-1], wrapped)
            applied.add(spec)

    class AfterImport:
        """Wraps the wanted functions of a module once it has been executed."""

        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name not in wanted:
                return None
            finders: list[Any] = [f for f in sys.meta_path if f is not self]
            for finder in finders:
                spec = (
                    finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
                )
                if spec is not None:
                    break
            else:
                return None
            loader: Any = spec.loader
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            run = loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                wrap_in(name, module)

            loader.exec_module = exec_module
            return spec

    if wanted:
        for name in [n for n in wanted if n in sys.modules]:
            wrap_in(name, sys.modules[name])
        sys.meta_path.insert(0, AfterImport())

    def dump() -> None:
        for module_name, attrs in wanted.items():
            for attr in attrs:
                spec = f"{module_name}:{attr}"
                if spec not in applied and not any(spec in n for n in notes):
                    note(f"not wrapped: {spec} (module not imported)", say=False)
        path = os.path.join(out, f"{role}-{os.getpid()}.trace")
        with open(path + ".part", "wb") as f:
            for text in notes:
                raw = text.encode()
                f.write(b"%d i 0 %d\n" % (now(), len(raw)))
                f.write(raw)
            for t, kind, stream, data in trace:
                raw = b"".join(data) if type(data) is tuple else data
                f.write(b"%d %s %d %d\n" % (t, kind.encode(), stream, len(raw)))
                f.write(raw)
        os.replace(path + ".part", path)

    atexit.register(dump)


def _start() -> None:
    out = os.environ.get("BENCH_STEPS_OUT")
    role = _role() if out else None
    if out and role:
        _install(out, role)


_start()
