"""Retiring partition layouts: resized down and up with runs in flight, through the CLI with
the operator's credential, and the map's compare-and-set against replicas at once."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from interlock.runtime.client import InterlockClient
from interlock.runtime.layouts import Housekeeping, _needing, retire_layouts
from interlock.runtime.layoutwatch import RECOUNT_S
from interlock.runtime.ownership import owners
from interlock.runtime.partitioning import set_partitions
from interlock.runtime.service import Orchestrator
from interlock.transport.clock import utc_now
from interlock.transport.partitions import Layout, PartitionMap, partition_of, read_map
from interlock.transport.subjects import Subjects
from support.auth import SUBJECTS, Secured, secured, secured_server  # noqa: F401
from support.runtime import WAITER, cli_env, connect, eventually, run_cli


def _ids(wanted: Callable[[str], bool], n: int) -> list[str]:
    """``n`` run ids that ``wanted`` accepts."""
    found = (f"lay{i}" for i in itertools.count())
    return list(itertools.islice((r for r in found if wanted(r)), n))


async def _cli(env: dict[str, str], *args: str) -> Any:
    """``interlock ARGS`` (in a thread: the orchestrator runs on this event loop)."""
    done = await asyncio.to_thread(run_cli, *args, env=env)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout) if "--json" in args else done.stdout


async def _until(check: Callable[[], Any], what: str, within: float = 20.0) -> Any:
    began = time.monotonic()
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert time.monotonic() - began < within, what
        await asyncio.sleep(0.25)


@pytest.mark.asyncio(loop_scope="module")
async def test_lowering_and_raising_p_with_runs_in_flight_retires_and_forgets_layouts(
    secured: Secured,  # noqa: F811
    tmp_path: Path,
) -> None:
    archive = tmp_path / "archive"
    env = cli_env(secured.url, SUBJECTS.prefix, INTERLOCK_CREDS=str(secured.auth.operator))
    operator = secured.operator
    assert "new runs go to 3 partitions (layout 2)" in await _cli(env, "partitions", "set", "3")
    # Runs only the 3-partition layout places where they are (partitions 1 and 2).
    waiting, ended = (
        _ids(lambda r: partition_of(r, 3) != 0, 3)[:2],
        _ids(lambda r: partition_of(r, 3) == 2, 4)[3:],
    )
    for run_id in (*waiting, *ended):
        await operator.start("awaiting", {}, run_id=run_id)
    await _cli(env, "signal", ended[0], "acme.order.approved")
    # Lowered to one partition: the first layout (1) places nothing the live ones do not,
    # so it goes at once; layout 2 has runs in flight.
    assert "new runs go to 1 partition (layout 3)" in await _cli(env, "partitions", "set", "1")
    done = await _cli(env, "partitions", "retire", "--grace", "0", "--json")
    assert done["retired"] == [1]
    assert done["forgotten"] == [1]
    assert "2 run(s) in flight" in done["kept"]["2"]
    assert done["layouts"] == [2, 3]
    # The default grace keeps a layout replaced a moment ago.
    kept = await _cli(env, "partitions", "retire", "--json")
    assert "replaced less than 60 s ago" in kept["kept"]["2"]
    table = await _cli(env, "partitions")
    assert "layouts: 2: 3, 3: 1" in table
    # A run started now goes to partition 0; the runs in flight finish where they are.
    # (by a process that reads the map now: one that read it before places by it for up
    # to PLACE_FRESH_S more, which the grace of a retirement covers)
    later = _ids(lambda r: partition_of(r, 3) == 1, 6)[5]
    await _cli(env, "start", "awaiting", "--run-id", later)
    assert (await operator.log.where(later))[0] == SUBJECTS.runs_stream
    for run_id in waiting:
        assert "and completed" in await _cli(env, "signal", run_id, "acme.order.approved")

    # Retired once the relay has acted on the ends of its runs.
    done = await _until(lambda: _retires(env, 2), "layout 2 was not retired")
    assert done["retired_layouts"] == [2]
    assert "3 ended run(s) stored by it" in done["kept"]["2"]
    shown = await _cli(env, "partitions", "--json")
    assert [(x["version"], x["retired"]) for x in shown["layouts"]] == [(2, True), (3, False)]
    assert [p["relayed"] for p in shown["partitions"]] == [True, False, False]
    # The orchestrator lets the retired partitions' leases go.
    nc = operator.nc
    await _until(
        lambda: _no_owner(nc, SUBJECTS, {1, 2}), "the retired partitions kept their owners"
    )
    assert "retired" in await _cli(env, "partitions")
    # Ended runs in retired partitions are read by processes that never saw them.
    assert "completed" in await _cli(env, "describe", "run", waiting[1])
    exported = await _cli(env, "export", ended[0])
    assert exported.count("\n") >= 3
    assert ended[0] in exported
    again = await asyncio.to_thread(run_cli, "start", "awaiting", "--run-id", waiting[0], env=env)
    assert again.returncode != 0
    # Raised again with a run in flight of the one-partition layout: the retired layout
    # places every stored run where the new one does, so it is forgotten; the streams of
    # partitions 1 and 2 are relayed again.
    assert "new runs go to 3 partitions (layout 4)" in await _cli(env, "partitions", "set", "3")
    await _until(lambda: _owned(nc, SUBJECTS, {0, 1, 2}), "the partitions were not relayed again")
    fresh = _ids(lambda r: partition_of(r, 3) == 2, 9)[8]
    await _cli(env, "start", "awaiting", "--run-id", fresh)
    assert "and completed" in await _cli(env, "signal", fresh, "acme.order.approved")
    done = await _cli(env, "partitions", "retire", "--grace", "0", "--json")
    # Forgotten by this pass, or by the orchestrator's (the map changed) a moment before.
    assert done["forgotten"] in ([2], [])
    assert 2 not in done["layouts"] + done["retired_layouts"]
    assert "1 run(s) in flight" in done["kept"]["3"]
    assert "and completed" in await _cli(env, "signal", later, "acme.order.approved")
    await _until(lambda: _retires(env, 3), "layout 3 was not retired")
    found, _ = await read_map(nc, SUBJECTS)
    assert [x.count for x in found.layouts] == [3]
    assert [x.version for x in found.retired] == [3]
    assert found.made == 3
    for run_id in (*waiting, *ended, later, fresh):
        assert (await InterlockClient(nc, SUBJECTS).state(run_id)).status == "completed"
    # The ended runs that keep layout 3 are where the live layout does not place them;
    # archived and deleted, the layout goes.
    kept = await _cli(env, "partitions", "kept", "--json")
    assert later in kept["layouts"]["3"]
    assert set(kept["layouts"]) == {"3"}
    assert kept["runs"] == len(kept["layouts"]["3"])
    for run_id in kept["layouts"]["3"]:
        assert partition_of(run_id, 3) != 0
        assert (await operator.log.where(run_id))[0] == SUBJECTS.runs_stream
    listed = await asyncio.to_thread(run_cli, "partitions", "kept", env=env)
    assert listed.stdout.split() == kept["layouts"]["3"]
    assert "keep layout(s) 3 in the partition map" in listed.stderr
    for run_id in kept["layouts"]["3"]:
        await _cli(env, "runs", "delete", run_id, "--archive-dir", str(archive))
    assert (archive / f"{later}.jsonl").exists()
    done = await _cli(env, "partitions", "retire", "--json")
    assert done["forgotten"] in ([3], [])  # (or by the orchestrator's pass, reading the deletions)
    assert done["retired_layouts"] == []
    assert (await _cli(env, "partitions", "kept", "--json")) == {"layouts": {}, "runs": 0}


async def _retires(env: dict[str, str], version: int) -> Any:
    """A pass's report once ``version`` is retired (by it, or by an orchestrator's pass
    a moment before), else None."""
    got = await _cli(env, "partitions", "retire", "--grace", "0", "--json")
    return got if version in got["retired_layouts"] else None


async def _no_owner(nc: Any, subjects: Subjects, partitions: set[int]) -> bool:
    return not (set(await owners(nc, subjects)) & partitions)


async def _owned(nc: Any, subjects: Subjects, partitions: set[int]) -> bool:
    return partitions <= set(await owners(nc, subjects))


def test_layouts_go_one_at_a_time_so_a_run_two_of_them_place_stays_found() -> None:
    # Two retired layouts of 3 and 6 partitions both place run r in partition 2 (where
    # the live one of 1 does not): forgetting one must keep the other.
    run_id = _ids(lambda r: partition_of(r, 3) == 2 and partition_of(r, 6) == 2, 1)[0]
    three, six, one = (Layout(version=v, count=c) for v, c in ((1, 3), (2, 6), (3, 1)))
    stored = {0: [], 1: [], 2: [run_id]}
    assert _needing(stored, three, [six, one]) == []
    assert _needing(stored, six, [one]) == [(2, run_id)]
    m = PartitionMap(layouts=(one,), retired=(three, six))
    assert m.candidates(run_id) == (0, 2)
    assert m.live_candidates(run_id) == (0,)
    assert m.relayed == 1
    assert m.streams == 6
    assert not m.single


@pytest.mark.asyncio(loop_scope="module")
async def test_replicas_retiring_at_once_and_a_resize_meanwhile_keep_the_map_whole(
    nats_url: str, subjects: Subjects
) -> None:
    client = InterlockClient(await connect(nats_url), subjects)
    await client.ensure_provisioned()
    nc = client.nc
    others = [await connect(nats_url) for _ in range(2)]
    try:
        await set_partitions(nc, subjects, 4)
        await set_partitions(nc, subjects, 2)
        # Two replicas' passes and an operator's resize, all at once: each writes with a
        # compare-and-set, the losers read the map again and decide again.
        results = await asyncio.gather(
            retire_layouts(others[0], subjects, grace=0),
            retire_layouts(others[1], subjects, grace=0),
            set_partitions(nc, subjects, 5),
        )
        found, _ = await read_map(nc, subjects)
        assert found.current.count == 5
        assert results[2][1]
        gone = {x.version for r in results[:2] for x in r.forgotten}
        assert {x.version for x in found.layouts} | gone >= {2, 3, 4}
        assert gone <= {1, 2, 3}
        # No run is stored: every layout but the current one goes, and the streams stay.
        done = await retire_layouts(nc, subjects, grace=0)
        assert [x.count for x in done.map.layouts] == [5]
        assert done.map.retired == ()
        assert done.map.made == 5
        info = await client.js.stream_info(subjects.runs_stream_of(4))
        assert info.config.name == subjects.runs_stream_of(4)
    finally:
        for other in others:
            await other.close()
        await nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_layout_waits_for_the_relay_to_act_on_the_end_of_its_last_run(
    nats_url: str, subjects: Subjects
) -> None:
    client = InterlockClient(await connect(nats_url), subjects)
    await client.ensure_provisioned()
    assert (await client.apply([("waiter.yaml", WAITER)])).compiled.ok
    await set_partitions(client.nc, subjects, 3)
    first = Orchestrator(await connect(nats_url), subjects)
    await first.start()
    js = client.js
    relay_of = subjects.runs_stream_of(2)

    async def relayed() -> bool:
        try:
            await js.consumer_info(relay_of, "relay")
        except NotFoundError:
            return False
        return True

    await eventually(relayed, what="partition 2 relayed")
    await first.stop()
    await first.nc.close()
    # With no orchestrator up, a run of partition 2 starts and is cancelled: it has ended,
    # but nothing has acted on its records yet.
    run_id = _ids(lambda r: partition_of(r, 3) == 2, 1)[0]
    await client.start("waiter", {}, run_id=run_id)
    assert await client.cancel(run_id)
    await set_partitions(client.nc, subjects, 1)
    done = await retire_layouts(client.nc, subjects, grace=0)
    assert [x.version for x in done.retired] == [1]
    assert "partition 2's relay has 2 message(s) to act on" in done.kept[2]
    second = Orchestrator(await connect(nats_url), subjects)
    await second.start()
    try:
        done = await eventually(
            lambda: _retiring(client, subjects, 2), within=20, what="layout 2 retired"
        )
        assert [x.count for x in done.map.layouts] == [1]
    finally:
        await second.stop()
        await second.nc.close()
        await client.nc.close()


async def _retiring(client: InterlockClient, subjects: Subjects, version: int) -> Any:
    done = await retire_layouts(client.nc, subjects, grace=0)
    return done if [x.version for x in done.retired] == [version] else None


@pytest.mark.asyncio(loop_scope="module")
async def test_housekeeping_lists_the_stored_runs_only_when_a_run_ended_or_was_deleted(
    nats_url: str, subjects: Subjects
) -> None:
    client = InterlockClient(await connect(nats_url), subjects)
    await client.ensure_provisioned()
    nc = client.nc
    assert (await client.apply([("waiter.yaml", WAITER)])).compiled.ok
    await set_partitions(nc, subjects, 3)
    # Runs only the layout of 3 places where they are: one in flight, one ended.
    waiting, ended = _ids(lambda r: partition_of(r, 3) != 0, 2)
    for run_id in (waiting, ended):
        await client.start("waiter", {}, run_id=run_id)
    assert await client.cancel(ended)
    await set_partitions(nc, subjects, 1)
    tidy = Housekeeping(every=0, grace=0)

    async def passes(listed: int, checked: int) -> PartitionMap:
        await tidy.pass_now(nc, subjects)
        assert tidy.passes == {"listed": listed, "checked": checked}
        return (await read_map(nc, subjects))[0]

    found = await passes(1, 0)  # a process's first pass lists
    assert [x.version for x in found.layouts] == [2, 3]
    assert (await passes(1, 1)).layouts == found.layouts  # the run in flight is read alone
    assert await client.cancel(waiting)
    found = await passes(2, 1)  # it ended: listed, retired
    assert [x.version for x in found.retired] == [2]
    await passes(2, 2)
    # A count older than RECOUNT_S is listed again once a run was deleted since (a
    # deletion that raced its listing is never read), whatever the count left.
    counted = time.time_ns() - int((RECOUNT_S + 1) * 1e9)
    old = (await retire_layouts(nc, subjects, grace=0, now=utc_now(counted))).watch
    assert old is not None
    assert old.ended == {2: 2}
    assert await old.changed(nc, subjects, datetime.now(UTC)) == ""
    await client.delete(ended, await client.read(ended), None)
    assert "deleted since they were counted" in await old.changed(nc, subjects, datetime.now(UTC))
    await passes(2, 3)  # one deletion read: one of its two runs is left
    await client.delete(waiting, await client.read(waiting), None)
    found = await passes(3, 3)  # none left: listed, forgotten
    assert (found.retired, [x.count for x in found.layouts]) == ((), [1])
    # A resize is a change the next pass looks at.
    await set_partitions(nc, subjects, 2)
    await passes(4, 3)
    await passes(4, 4)
    await nc.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_run_being_deleted_as_a_pass_lists_does_not_keep_its_layout_for_good(
    nats_url: str, subjects: Subjects
) -> None:
    client = InterlockClient(await connect(nats_url), subjects)
    await client.ensure_provisioned()
    nc, js = client.nc, client.js
    assert (await client.apply([("waiter.yaml", WAITER)])).compiled.ok
    await set_partitions(nc, subjects, 3)
    run_id = _ids(lambda r: partition_of(r, 3) != 0, 1)[0]
    await client.start("waiter", {}, run_id=run_id)
    assert await client.cancel(run_id)
    await set_partitions(nc, subjects, 1)
    first = await retire_layouts(nc, subjects, grace=0)
    assert [x.version for x in first.map.retired] == [2]
    assert first.watch is not None
    assert first.watch.ended == {2: 1}
    # A deletion records itself in the audit stream, then purges the log: a pass that
    # lists in between finds the run stored, and never reads its deletion afterwards.
    await js.publish(
        subjects.audit_deleted(run_id), b"{}", headers={"Nats-Msg-Id": f"deleted:{run_id}"}
    )
    done = await retire_layouts(nc, subjects, grace=0)
    assert "1 ended run(s) stored by it" in done.kept[2]  # still stored: kept
    assert done.watch is not None
    assert done.watch.ended == {2: 0}  # but not counted
    stream, subject = await client.log.where(run_id)
    await js.purge_stream(stream, subject=subject)
    assert "were deleted" in await done.watch.changed(nc, subjects, datetime.now(UTC))
    assert (await retire_layouts(nc, subjects, grace=0)).forgotten[0].version == 2
    await nc.close()
