"""`interlock creds` as a user types it, against a real nats-server that trusts its keys:
issue works at once (no restart), revoke disconnects and refuses, the CLI run where
`interlock dev` keeps its data uses the operator's credential by itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError

from interlock.auth.dev import prepare, record_context
from interlock.auth.jwt import creds_user
from interlock.auth.roles import inbox_prefix
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.subjects import Subjects

INTERLOCK = str(Path(sys.executable).with_name("interlock"))


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_") and k != "NATS_URL"
    }
    environ.update(env)
    return subprocess.run(
        [INTERLOCK, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def installation(tmp_path: Path) -> Iterator[tuple[EmbeddedNats, Path]]:
    """A server set up as `interlock dev` does it, in ``tmp_path/.interlock``."""
    data = tmp_path / ".interlock"
    auth = prepare(data, Subjects("il"), ["echo"])
    server = EmbeddedNats(data, args=auth.server_args)
    server.start()
    try:
        yield server, tmp_path
    finally:
        server.stop()


ECHO = Path(__file__).resolve().parents[2] / "agents/interlock_agents/manifests/echo.yaml"


async def test_issue_list_revoke(installation: tuple[EmbeddedNats, Path]) -> None:
    server, home = installation
    keys = str(home / ".interlock" / "keys")
    # The operator's CLI provisions the streams when it applies (reading provisions nothing).
    assert cli("runs", cwd=home, INTERLOCK_URL=server.url).returncode == 0
    applied = cli("apply", str(ECHO), cwd=home, INTERLOCK_URL=server.url)
    assert applied.returncode == 0, applied.stderr
    done = cli("creds", "issue", "agent", "-o", "x.creds", "--keys", keys, cwd=home)
    assert done.returncode == 2
    assert "at least one --capability" in done.stderr
    done = cli(
        "creds", "issue", "publisher", "--events", "acme.>", "--name", "acme",
        "-o", "acme.creds", "--keys", keys, cwd=home, INTERLOCK_URL=server.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    creds = home / "acme.creds"
    assert creds.stat().st_mode & 0o077 == 0

    # Works at once on the running server, within its pattern only.
    nc = await nats.connect(
        server.url,
        user_credentials=str(creds),
        inbox_prefix=inbox_prefix(creds_user(creds)),
        allow_reconnect=False,
    )
    try:
        ack = await nc.jetstream().publish("il.events.acme.order.placed", b"{}")
        assert ack.stream == "IL_EVENTS"
    finally:
        await nc.close()

    listed = json.loads(cli("creds", "list", "--json", "--keys", keys, cwd=home).stdout)
    assert [i["name"] for i in listed if i["role"] == "publisher"] == ["acme"]

    done = cli("creds", "revoke", "acme", "--server", server.url, "--keys", keys, cwd=home)
    assert done.returncode == 0, done.stderr
    assert "pushed" in done.stdout
    with pytest.raises(NatsError, match=r"(?i)revoked|authorization violation"):
        await nats.connect(server.url, user_credentials=str(creds), allow_reconnect=False)
    listed = json.loads(cli("creds", "list", "--json", "--keys", keys, cwd=home).stdout)
    assert next(i for i in listed if i["name"] == "acme")["revoked_at"] > 0
    # The table: a header as `interlock runs` and `agents` print, then a row per credential.
    header, *rows = cli("creds", "list", "--keys", keys, cwd=home).stdout.splitlines()
    assert header.split() == ["NAME", "ROLE", "USER", "ISSUED", "STATE", "SCOPE"]
    [row] = [r for r in rows if r.startswith("acme ")]
    acme = row.split()
    user = next(i for i in listed if i["name"] == "acme")["public_key"]
    assert (acme[:3], acme[4:]) == (["acme", "publisher", user], ["REVOKED", "acme.>"])
    assert header.index("STATE") == row.index("REVOKED")


def test_an_agent_credential_may_not_share_a_capabilitys_token(
    installation: tuple[EmbeddedNats, Path],
) -> None:
    """``review.deep`` and ``review_deep`` are one NATS token: one task consumer, one set
    of heartbeat keys. A credential for the second while one for the first stands would
    take the first's tasks: refused, nothing written, until the first is revoked."""
    server, home = installation
    keys = str(home / ".interlock" / "keys")

    def issue(name: str, *caps: str) -> subprocess.CompletedProcess[str]:
        flags = [f for cap in caps for f in ("--capability", cap)]
        return cli(
            "creds", "issue", "agent", *flags, "--name", name, "-o", f"{name}.creds",
            "--keys", keys, cwd=home, INTERLOCK_URL=server.url,
        )  # fmt: skip

    done = issue("deep", "review.deep")
    assert done.returncode == 0, done.stderr
    done = issue("flat", "review_deep")
    assert done.returncode == 2
    assert (
        "capability 'review_deep' has the NATS token 'review_deep' of capability "
        "'review.deep' (credential 'deep')"
    ) in done.stderr
    assert not (home / "flat.creds").exists()
    done = issue("both", "x.y", "x_y")
    assert done.returncode == 2
    assert "of capability 'x.y' (this credential)" in done.stderr
    listed = json.loads(cli("creds", "list", "--json", "--keys", keys, cwd=home).stdout)
    assert {i["name"] for i in listed} >= {"deep"}
    assert not {"flat", "both"} & {i["name"] for i in listed}

    revoked = cli("creds", "revoke", "deep", "--no-push", "--keys", keys, cwd=home)
    assert revoked.returncode == 0, revoked.stderr
    done = issue("flat", "review_deep")
    assert done.returncode == 0, done.stderr
    done = issue("deep-again", "review.deep")  # the same token, the other way round
    assert done.returncode == 2
    assert "of capability 'review_deep' (credential 'flat')" in done.stderr


def test_the_cli_uses_the_operator_credential_of_interlock_dev(
    installation: tuple[EmbeddedNats, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    server, home = installation
    done = cli("runs", "--json", cwd=home, INTERLOCK_URL=server.url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    # Elsewhere, without credentials: refused, with the reason.
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    done = cli("runs", cwd=elsewhere, INTERLOCK_URL=server.url)
    assert done.returncode == 2
    assert "refused the credentials" in done.stderr
    # INTERLOCK_CREDS from anywhere.
    operator = str(home / ".interlock" / "creds" / "operator.creds")
    done = cli("runs", cwd=elsewhere, INTERLOCK_URL=server.url, INTERLOCK_CREDS=operator)
    assert done.returncode == 0, done.stderr


def test_an_agent_worker_refuses_a_credential_missing_its_capabilities(
    installation: tuple[EmbeddedNats, Path],
) -> None:
    server, home = installation
    keys = str(home / ".interlock" / "keys")
    done = cli(
        "creds", "issue", "agent", "--capability", "echo", "-o", "e.creds", "--keys", keys,
        cwd=home, INTERLOCK_URL=server.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The echo worker serves echo and review.
    done = cli(
        "agent", "run", "echo", "--creds", "e.creds", "--metrics-port", "0",
        cwd=home, INTERLOCK_URL=server.url,
    )  # fmt: skip
    assert done.returncode == 2
    assert "also serves review" in done.stderr
    assert "--capability echo --capability review" in done.stderr


def test_keys_made_elsewhere_are_named_with_keys_or_its_variable(tmp_path: Path) -> None:
    """operations.md makes the keys in ./keys; a later `creds` command without --keys is
    told where it looked and how to name the folder, and finds them when named."""
    made = cli("creds", "init", "--keys", "keys", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    lost = cli("creds", "list", cwd=tmp_path)
    assert lost.returncode != 0
    assert "no keys in .interlock/keys: name the folder" in lost.stderr
    assert "with --keys DIR or INTERLOCK_KEYS=DIR" in lost.stderr
    found = cli("creds", "list", "--json", cwd=tmp_path, INTERLOCK_KEYS="keys")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == []
    empty = cli("creds", "list", cwd=tmp_path, INTERLOCK_KEYS="keys")
    assert empty.stdout == "no credentials issued from these keys (interlock creds issue ROLE)\n"


def test_creds_from_another_folder_are_told_where_the_last_dev_keeps_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI run from any folder uses the last `interlock dev`'s server and credential;
    `creds`, which needs its keys, names where that dev keeps them."""
    context = str(tmp_path / "dev.json")
    monkeypatch.setenv("INTERLOCK_CONTEXT", context)
    data = tmp_path / "dev" / ".interlock"
    auth = prepare(data, Subjects("il"), ["echo"])
    assert record_context("nats://127.0.0.1:4222", auth.operator, data) is not None  # as dev
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    keys = data.resolve() / "keys"
    lost = cli("creds", "list", cwd=elsewhere, INTERLOCK_CONTEXT=context)
    assert lost.returncode == 2
    assert lost.stderr.startswith("interlock: no keys in .interlock/keys: name the folder")
    assert lost.stderr.endswith(
        f"; the last `interlock dev` keeps its keys in {keys}: --keys {keys}\n"
    )
    found = cli("creds", "list", "--keys", str(keys), cwd=elsewhere, INTERLOCK_CONTEXT=context)
    assert found.returncode == 0, found.stderr
    assert "dev-operator" in found.stdout
    # In the dev's own folder the keys are found: nothing to name.
    there = cli("creds", "list", cwd=data.parent, INTERLOCK_CONTEXT=context)
    assert there.returncode == 0, there.stderr


async def test_a_rotation_under_one_name_revokes_only_the_credential_named_by_file(
    installation: tuple[EmbeddedNats, Path],
) -> None:
    """operations.md rotates a credential: issue a new one, deploy it, revoke the old. Under
    the same name (the default one, say) a revoke by name is refused, naming both, where it
    revoked the new credential with the old."""
    server, home = installation
    keys = str(home / ".interlock" / "keys")
    issue = ("creds", "issue", "publisher", "--events", "acme.>", "--name", "shop")
    for file in ("old.creds", "new.creds"):
        done = cli(*issue, "-o", file, "--keys", keys, cwd=home, INTERLOCK_URL=server.url)
        assert done.returncode == 0, done.stderr
    users = [creds_user(home / f) for f in ("old.creds", "new.creds")]
    revoke = ("creds", "revoke", "--keys", keys, "--server", server.url)
    refused = cli(*revoke, "shop", cwd=home)
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr.startswith("interlock: shop names 2 credentials not revoked: ")
    assert all(user in refused.stderr for user in users)
    assert refused.stderr.endswith("name the one to revoke by its user key or creds file\n")
    listed = json.loads(cli("creds", "list", "--json", "--keys", keys, cwd=home).stdout)
    assert [i.get("revoked_at") for i in listed if i["name"] == "shop"] == [None, None]
    done = cli(*revoke, "old.creds", cwd=home)
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, "revoked 1 user(s) in " + keys)
    new = home / "new.creds"
    nc = await nats.connect(
        server.url, user_credentials=str(new), inbox_prefix=inbox_prefix(users[1]),
        allow_reconnect=False,
    )  # fmt: skip
    await nc.close()
    # One left under the name: the name revokes it.
    done = cli(*revoke, "shop", cwd=home)
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, "revoked 1 user(s) in " + keys)
