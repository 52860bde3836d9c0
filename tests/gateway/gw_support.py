"""A real stack (nats-server, orchestrator, test worker) with the HTTP gateway served by
uvicorn on a real socket, and callers holding a token of each role."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from helpers import HELLO, TIMEOUT, Stack, connect, running_stack, yaml

from interlock.gateway.app import build_app
from interlock.gateway.service import Gateway
from interlock.transport.httpserver import HttpServer
from interlock.transport.subjects import Subjects

__all__ = ["HELLO", "TIMEOUT", "GatewayStack", "gateway_stack", "yaml"]


@dataclass
class GatewayStack:
    stack: Stack
    gateway: Gateway
    url: str
    tokens: dict[str, str] = field(default_factory=dict)

    def http(self, role: str | None = "operator") -> httpx.AsyncClient:
        """A client holding the token of ``role`` (None: no credentials)."""
        headers = {} if role is None else {"Authorization": f"Bearer {self.tokens[role]}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=TIMEOUT)

    async def stored_events(self) -> int:
        info = await self.stack.js.stream_info(self.stack.subjects.events_stream)
        return int(info.state.messages)


@contextlib.asynccontextmanager
async def gateway_stack(
    url: str,
    subjects: Subjects,
    manifests: Iterable[str] = (),
    *,
    max_body: int = 64 * 1024,
) -> AsyncIterator[GatewayStack]:
    async with running_stack(url, subjects, manifests) as stack:
        nc = await connect(url)
        gateway = Gateway(nc, subjects, max_body=max_body)
        await gateway.start()
        server = HttpServer(build_app(gateway), 0)
        await server.start()
        try:
            gs = GatewayStack(stack, gateway, server.url)
            gs.tokens["operator"] = await gateway.tokens.issue("ops", "operator")
            gs.tokens["reader"] = await gateway.tokens.issue("dash", "reader")
            gs.tokens["publisher"] = await gateway.tokens.issue(
                "ci", "publisher", ["com.example.*"]
            )
            yield gs
        finally:
            await server.stop()
            await gateway.stop()
            await nc.close()
