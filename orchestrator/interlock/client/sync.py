"""The client's calls for programs without asyncio."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from interlock.client.client import Client

if TYPE_CHECKING:
    from interlock.core import events as ev

T = TypeVar("T")


class SyncClient:
    """:class:`Client`'s calls for programs without asyncio: each call blocks until done.

    It runs an event loop on a thread of its own::

        with SyncClient.connect() as client:
            run_id = client.start("hello", {"message": "hi"})
            print(client.result(run_id, wait=True, timeout=30).outputs)
    """

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self._client = client
        self._loop = loop
        self._thread = thread

    @classmethod
    def connect(cls, server: str | list[str] | None = None, **options: Any) -> SyncClient:
        """As :meth:`Client.connect`."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="interlock-client", daemon=True)
        thread.start()
        try:
            client = asyncio.run_coroutine_threadsafe(
                Client.connect(server, **options), loop
            ).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        return cls(client, loop, thread)

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name == "logs":

            def logs(*args: Any, **kwargs: Any) -> Iterator[ev.AnyRecord]:
                agen = method(*args, **kwargs)
                while True:
                    try:
                        yield self._call(agen.__anext__)
                    except StopAsyncIteration:
                        return

            return logs
        if not callable(method) or not asyncio.iscoroutinefunction(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(lambda: method(*args, **kwargs))

        return call
