"""A party's own object bucket (its large events or answers) is bounded: a publisher that
keeps uploading fills its bucket, not the servers' disk, which every stream shares. The
credential and its bound come from `interlock creds issue --upload-limit` as an operator
types it; the publisher's `interlock emit` past the bound is refused with what is full,
and nothing is published."""

from __future__ import annotations

import json
from pathlib import Path

from test_creds_cli import ECHO, cli, installation

from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.connection import ConnectOptions, connect
from interlock.transport.jetstream import jetstream
from interlock.transport.subjects import Subjects

__all__ = ["installation"]  # the fixture

SUBJECTS = Subjects("il")


def _emit(home: Path, url: str, creds: Path, n: int) -> tuple[int, str]:
    data = home / f"big-{n}.json"
    data.write_text(json.dumps({"blob": str(n) * 700_000}))
    done = cli(
        "emit", "acme.doc.uploaded", "--source", "test", "--id", f"doc-{n}",
        "--data", f"@{data}", "--creds", str(creds), cwd=home, INTERLOCK_URL=url,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


async def _events(url: str, creds: Path) -> int:
    nc = await connect(ConnectOptions.resolve(url, creds_file=str(creds)))
    try:
        info = await jetstream(nc).stream_info(SUBJECTS.events_stream)
        return info.state.messages
    finally:
        await nc.close()


async def test_a_publisher_fills_its_own_bucket_up_to_its_bound(
    installation: tuple[EmbeddedNats, Path],
) -> None:
    server, home = installation
    keys = str(home / ".interlock" / "keys")
    assert cli("apply", str(ECHO), cwd=home, INTERLOCK_URL=server.url).returncode == 0
    wrong = cli(
        "creds", "issue", "publisher", "--events", "acme.>", "--upload-limit", "12 parsecs",
        "-o", "x.creds", "--keys", keys, cwd=home, INTERLOCK_URL=server.url,
    )  # fmt: skip
    assert wrong.returncode == 2
    assert "--upload-limit" in wrong.stderr
    assert "is not a size" in wrong.stderr
    assert not (home / "x.creds").exists()
    done = cli(
        "creds", "issue", "publisher", "--events", "acme.>", "--name", "acme",
        "--upload-limit", "1MiB", "-o", "acme.creds", "--keys", keys,
        cwd=home, INTERLOCK_URL=server.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    creds = home / "acme.creds"
    operator = home / ".interlock" / "creds" / "operator.creds"

    code, said = _emit(home, server.url, creds, 1)
    assert code == 0, said  # 700 KB by reference, in its own bucket
    before = await _events(server.url, operator)
    code, said = _emit(home, server.url, creds, 2)
    assert code == 1, said
    assert "is full" in said
    assert "of the 1048576 it may" in said
    assert "--upload-limit" in said
    assert await _events(server.url, operator) == before  # nothing published
