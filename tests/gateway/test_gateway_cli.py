"""``interlock gateway`` and ``interlock tokens`` as a user runs them."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid

import httpx

from interlock.transport.subjects import Subjects
from support.accounts import gateway_creds
from support.gateway import TIMEOUT
from support.runtime import STARTUP_TIMEOUT, cli_env, interlock_bg, run_cli


def test_tokens_and_the_gateway_process(nats_url: str, subjects: Subjects) -> None:
    env = cli_env(nats_url, subjects.prefix)  # an operator's
    # The gateway on a credential of its own account, as `interlock creds issue` makes it.
    creds = asyncio.run(gateway_creds(nats_url, subjects))
    assert creds is not None
    gateway_env = cli_env(nats_url, subjects.prefix, INTERLOCK_CREDS=str(creds))
    made = run_cli("tokens", "create", "ci", "--role", "publisher", env=env)
    assert made.returncode == 1
    assert "--events" in made.stderr
    made = run_cli(
        "tokens", "create", "ci", "--role", "publisher", "--events", "com.acme.>", env=env
    )
    assert made.returncode == 0, made.stderr
    publisher = made.stdout.strip()
    assert publisher.startswith("ilt_")
    reader = run_cli("tokens", "create", "dash", "--role", "reader", env=env).stdout.strip()
    listed = json.loads(run_cli("tokens", "list", "--json", env=env).stdout)
    assert [(t["name"], t["role"], t["events"]) for t in listed] == [
        ("ci", "publisher", ["com.acme.>"]),
        ("dash", "reader", []),
    ]
    assert publisher not in json.dumps(listed)
    # The table: a header as `interlock runs` and `agents` print, then a row per token.
    table = run_cli("tokens", "list", env=env)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["NAME", "ROLE", "CREATED", "EVENTS"]
    assert [r.split()[:2] + r.split()[3:] for r in rows] == [
        ["ci", "publisher", "com.acme.>"],
        ["dash", "reader"],
    ]
    created = {t["name"]: t["created"] for t in listed}
    assert [r.split()[2] for r in rows] == [
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created[n])) for n in ("ci", "dash")
    ]
    assert header.index("ROLE") == rows[0].index("publisher")
    assert publisher not in table.stdout

    gateway = interlock_bg("gateway", "--http-port", "0", "--host", "127.0.0.1", env=gateway_env)
    try:
        url = gateway.wait_for(r"HTTP gateway at (\S+)", STARTUP_TIMEOUT).group(1)
        with httpx.Client(base_url=url, timeout=TIMEOUT) as http:
            assert http.get("/runs").status_code == 401
            ok = http.get("/runs", headers={"Authorization": f"Bearer {reader}"})
            assert ok.status_code == 200, ok.text
            assert ok.json() == {"runs": [], "next_offset": None}
            event = {
                "ce-specversion": "1.0",
                "ce-id": "1",
                "ce-source": "s",
                "ce-type": "com.acme.built",
                "Authorization": f"Bearer {publisher}",
            }
            assert http.post("/events", headers=event).status_code == 202
            assert run_cli("tokens", "revoke", "ci", env=env).returncode == 0
            assert run_cli("tokens", "revoke", "ci", env=env).returncode == 1
            assert run_cli("tokens", "revoke", "dash", env=env).returncode == 0
            none = run_cli("tokens", "list", env=env).stdout
            assert none == "no tokens (interlock tokens create NAME --role ROLE)\n"
            assert json.loads(run_cli("tokens", "list", "--json", env=env).stdout) == []
    finally:
        gateway.signal(signal.SIGTERM)
        code = gateway.wait(30)
    assert code == 0, gateway.output


def test_open_mode_listens_on_loopback_only(nats_url: str) -> None:
    env = cli_env(nats_url, f"t{uuid.uuid4().hex[:12]}")
    refused = run_cli("gateway", "--open", "--host", "0.0.0.0", "--http-port", "0", env=env)
    assert refused.returncode == 2
    assert "loopback" in refused.stderr
    gateway = interlock_bg("gateway", "--open", "--host", "127.0.0.1", "--http-port", "0", env=env)
    try:
        url = gateway.wait_for(r"HTTP gateway at (\S+)", STARTUP_TIMEOUT).group(1)
        with httpx.Client(base_url=url, timeout=TIMEOUT) as http:
            assert http.get("/workflows").status_code == 200
    finally:
        gateway.signal(signal.SIGTERM)
        assert gateway.wait(30) == 0, gateway.output
