"""The flow-control and partition commands as each party would type them, with the
credential `interlock creds issue` gives it: an agent's and a publisher's are refused by
NATS with one line naming what their credential is for; a gateway's may pause, resume,
fork and migrate (its routes do, for operators) but never change the partitions: ``set``
is refused with one line, and the partition map and its streams stay as they were."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from test_role_cli import EXIT_DENIED, cli, issued

from interlock.core import events as ev
from interlock.transport.partitions import read_map
from support.auth import SUBJECTS, Secured, secured, secured_server

__all__ = ["secured", "secured_server"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHANGES_PARTITIONS = (("partitions", "set", "3"),)


def commands(run_id: str) -> list[list[tuple[str, ...]]]:
    """Groups run one after another (a pause, then its resume), the groups at once."""
    return [
        [("pause", "workflow", "awaiting", "--reason", "x"), ("resume", "workflow", "awaiting")],
        [("pause", "run", run_id, "--reason", "x"), ("resume", "run", run_id)],
        [("fork", run_id, "--at", "2", "--dry-run"), ("migrate", "awaiting", "--to", "1")],
        [*CHANGES_PARTITIONS],
    ]


@pytest.mark.parametrize("role", ["agent", "publisher", "gateway"])
async def test_only_operators_change_partitions_and_parties_are_told(
    secured: Secured, role: str
) -> None:
    creds = await issued(secured, role)
    run_id = await secured.operator.start("awaiting", {})
    before, revision = await read_map(secured.operator.nc, SUBJECTS)
    streams = sorted([name async for name in _streams(secured)])
    groups = commands(run_id)
    few = asyncio.Semaphore(3)  # two cores

    async def run(group: list[tuple[str, ...]]) -> list[tuple[int, str, str, float]]:
        async with few:
            return [await cli(secured, creds, *args) for args in group]

    done = [d for ran in await asyncio.gather(*(run(g) for g in groups)) for d in ran]
    todo = [args for group in groups for args in group]
    for args, (code, out, errs, took) in zip(todo, done, strict=True):
        what = f"{role}: interlock {' '.join(args)} -> {code}\n{out}{errs}"
        assert "Traceback" not in errs, what
        assert took < 30, what
        if role != "gateway" or args in CHANGES_PARTITIONS:
            assert code == EXIT_DENIED, what
            lines = errs.strip().splitlines()
            assert len(lines) == 1, what
            assert lines[0].startswith("interlock: permission denied: this credential may not "), (
                what
            )
        else:
            assert code == 0, what
    after, revision_after = await read_map(secured.operator.nc, SUBJECTS)
    assert (after, revision_after) == (before, revision)
    assert sorted([name async for name in _streams(secured)]) == streams
    if role != "gateway":
        records = await secured.operator.read(run_id)
        assert not any(isinstance(r, ev.RunPaused) for r in records)


async def _streams(secured: Secured) -> AsyncIterator[str]:
    for name in await secured.operator.nc.jetstream().streams_info():
        if name.config.name and name.config.name.startswith("IL_RUNS"):
            yield name.config.name
