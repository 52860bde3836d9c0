"""The reference agents (echo, http-fetch, command), end to end through NATS."""

from __future__ import annotations

import http.server
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import interlock_agents
from interlock.core.compiler import compile_sources
from interlock_agents import command, echo, http_fetch


def new_run() -> str:
    return f"run{uuid.uuid4().hex[:10]}"


def error_of(event: Any) -> dict[str, Any]:
    assert event.type == "task.failed", event
    error: dict[str, Any] = event.data["error"]
    return error


@pytest.mark.parametrize("name", sorted(interlock_agents.REFERENCE_AGENTS))
def test_manifests_are_valid_agentdefs_matching_the_workers(name: str) -> None:
    compiled = compile_sources([(f"{name}.yaml", interlock_agents.manifest_text(name))])
    compiled.raise_for_errors()
    [agent] = compiled.agents
    assert agent.name == name
    worker = interlock_agents.load_worker(name)
    assert sorted(agent.capabilities) == sorted(worker.capabilities)


# --- echo ---------------------------------------------------------------------------------


async def test_echo_and_review(wire, runner) -> None:
    await runner.start(echo.worker)
    echoed, reviewed, defaulted, invalid = new_run(), new_run(), new_run(), new_run()
    await wire.publish_task("echo", {"any": {"thing": [1, "two"]}}, run_id=echoed)
    await wire.publish_task("review", {"diff": "+a\n-b\n+c", "score": 3}, run_id=reviewed)
    await wire.publish_task("review", {}, run_id=defaulted)
    await wire.publish_task("review", {"diff": 42}, run_id=invalid)

    event, _ = await wire.result(echoed)
    assert (event.type, event.data) == ("task.completed", {"any": {"thing": [1, "two"]}})
    event, _ = await wire.result(reviewed)
    assert event.data == {"score": 3, "summary": "echo reviewed 3 line(s) of diff: score 3"}
    event, _ = await wire.result(defaulted)
    assert event.data["score"] == 8
    assert error_of((await wire.result(invalid))[0])["class"] == "schema_error"


# --- http-fetch ---------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        port = self.server.server_address[1]
        if self.path == "/hello":
            self._send(200, b"hello", [("X-Test", "1")])
        elif self.path == "/big":
            self._send(200, b"x" * 2000)
        elif self.path == "/latin1":
            self._send(200, "caf\u00e9".encode("latin-1"), [], "text/plain; charset=latin-1")
        elif self.path == "/away":
            self._send(302, b"", [("Location", f"http://localhost:{port}/hello")])
        elif self.path == "/home":
            self._send(302, b"", [("Location", "/hello")])
        else:
            self._send(404, b"no such page")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self._send(201, b"got " + self.rfile.read(length))

    def _send(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[str, str]] | None = None,
        content_type: str = "text/plain; charset=utf-8",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers or []:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_http_fetch(wire, runner, site: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(http_fetch.ALLOW_HOSTS_ENV, "127.0.0.1, example.invalid")
    monkeypatch.setenv(http_fetch.ALLOW_PRIVATE_ENV, "127.0.0.1")
    await runner.start(http_fetch.worker)
    cases = {
        "ok": {"url": f"{site}/hello"},
        "big": {"url": f"{site}/big", "max_bytes": 100},
        "latin1": {"url": f"{site}/latin1"},
        "missing": {"url": f"{site}/missing"},
        "post": {"url": f"{site}/", "method": "POST", "body": "data"},
        "redirect_ok": {"url": f"{site}/home"},
        "redirect_away": {"url": f"{site}/away"},
        "host": {"url": "http://localhost:1/x"},
        "scheme": {"url": "file:///etc/passwd"},
    }
    runs = {name: new_run() for name in cases}
    for name, data in cases.items():
        await wire.publish_task("http.fetch", data, run_id=runs[name])

    async def answer(name: str) -> Any:
        return (await wire.result(runs[name]))[0]

    ok = await answer("ok")
    assert ok.type == "task.completed"
    assert ok.data["status"] == 200
    assert ok.data["body"] == "hello"
    assert ok.data["truncated"] is False
    assert ok.data["headers"]["x-test"] == "1"
    big = (await answer("big")).data
    assert (len(big["body"]), big["truncated"]) == (100, True)
    assert (await answer("latin1")).data["body"] == "caf\u00e9"
    missing = (await answer("missing")).data
    assert (missing["status"], missing["body"]) == (404, "no such page")
    post = (await answer("post")).data
    assert (post["status"], post["body"]) == (201, "got data")
    assert (await answer("redirect_ok")).data["body"] == "hello"
    error = error_of(await answer("redirect_away"))
    assert error["class"] == "agent_error"
    assert "'localhost' is not allowed" in error["message"]
    error = error_of(await answer("host"))
    assert (error["class"], error["retryable"]) == ("agent_error", False)
    assert "not allowed" in error["message"]
    assert error_of(await answer("scheme"))["class"] == "schema_error"


def test_http_fetch_refuses_other_schemes_even_without_the_schema() -> None:
    with pytest.raises(http_fetch.AgentError, match="only http and https"):
        http_fetch.check_url("ftp://example.com/x", http_fetch.Policy())
    http_fetch.check_url("https://anything.example/x", http_fetch.Policy())  # any host


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # shared (carrier-grade NAT)
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    ],
)
def test_http_fetch_refuses_addresses_that_are_not_public(address: str) -> None:
    with pytest.raises(http_fetch.AgentError, match="not a public address"):
        http_fetch.Policy().check_address("h.example", address)


def test_http_fetch_allows_public_addresses_and_private_ones_by_name_or_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    http_fetch.Policy().check_address("example.com", "93.184.215.14")
    http_fetch.Policy().check_address("example.com", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")
    monkeypatch.setenv(http_fetch.ALLOW_PRIVATE_ENV, "Intranet.Example, 10.0.0.0/8")
    policy = http_fetch.Policy.from_env()
    policy.check_address("intranet.example", "192.168.7.7")  # by the URL's host name
    policy.check_address("other.example", "10.20.30.40")  # by its network
    with pytest.raises(http_fetch.AgentError, match="not a public address"):
        policy.check_address("other.example", "192.168.7.7")
    monkeypatch.setenv(http_fetch.ALLOW_PRIVATE_ENV, "10.0.0.0/99")
    with pytest.raises(http_fetch.AgentError, match="is no network"):
        http_fetch.Policy.from_env()


def test_http_fetch_checks_the_address_after_a_redirect(site: str) -> None:
    """127.0.0.1 is allowed by name; its redirect to localhost (the same address, another
    name) is not."""
    policy = http_fetch.Policy(private_hosts=frozenset({"127.0.0.1"}))
    ok = http_fetch.fetch(http_fetch.FetchInput(url=f"{site}/home"), 5.0, policy)
    assert ok.body == "hello"
    with pytest.raises(http_fetch.AgentError, match=r"'localhost' is at .* not a public"):
        http_fetch.fetch(http_fetch.FetchInput(url=f"{site}/away"), 5.0, policy)


def test_http_fetch_unreachable_host_is_retryable() -> None:
    # Port 1 on localhost refuses connections.
    policy = http_fetch.Policy(private_hosts=frozenset({"127.0.0.1"}))
    with pytest.raises(http_fetch.RetryableError, match="failed"):
        http_fetch.fetch(http_fetch.FetchInput(url="http://127.0.0.1:1/"), 2.0, policy)


# --- command ------------------------------------------------------------------------------


async def test_command(wire, runner, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(command.ALLOW_ENV, "echo,false,sleep,pwd")
    await runner.start(command.worker)
    cases: dict[str, dict[str, Any]] = {
        "echo": {"command": ["echo", "hello", "$HOME", ";", "rm"]},
        "false": {"command": ["false"]},
        "cwd": {"command": ["pwd"], "cwd": str(tmp_path)},
        "denied": {"command": ["rm", "-rf", "/nonexistent"]},
        "path": {"command": ["/bin/echo", "x"]},
        "slow": {"command": ["sleep", "5"], "timeout_s": 0.2},
        "empty": {"command": []},
    }
    runs = {name: new_run() for name in cases}
    for name, data in cases.items():
        await wire.publish_task("command.run", data, run_id=runs[name])

    async def answer(name: str) -> Any:
        return (await wire.result(runs[name]))[0]

    echoed = (await answer("echo")).data
    assert echoed == {
        "exit_code": 0,
        "stdout": "hello $HOME ; rm\n",  # no shell: nothing expanded, nothing chained
        "stderr": "",
        "truncated": False,
    }
    assert (await answer("false")).data["exit_code"] == 1
    assert (await answer("cwd")).data["stdout"].strip() == str(tmp_path)
    for name in ("denied", "path"):
        error = error_of(await answer(name))
        assert (error["class"], error["retryable"]) == ("agent_error", False)
        assert "is not an allowed command" in error["message"]
    error = error_of(await answer("slow"))
    assert error["class"] == "agent_error"
    assert "did not finish within 0.2 s" in error["message"]
    assert error_of(await answer("empty"))["class"] == "schema_error"


def test_command_default_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(command.ALLOW_ENV, raising=False)
    assert command.allowed_programs() == {"echo", "uname", "true", "false"}
    monkeypatch.setenv(command.ALLOW_ENV, "")
    assert command.allowed_programs() == frozenset()
