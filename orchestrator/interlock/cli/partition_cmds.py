"""partitions: the run-log partitions of an installation, shown and changed live."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from interlock.cli.common import EXIT_OK, EXIT_USAGE, CliError
from interlock.cli.connecting import add_connection_flags, print_json, with_client

if TYPE_CHECKING:
    from interlock.client import Client
    from interlock.transport.partitions import Layout, PartitionMap

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parsers(sub: Sub) -> None:
    p = sub.add_parser(
        "partitions",
        help="the run-log partitions: layout, leaders, owners; set N changes P live",
        description="Without a verb: each partition's stream, its leader and peers, its "
        "messages and the orchestrator replica that relays it, and the layouts of the "
        "partition map. 'set N': new runs go to N partitions from now on; runs under way "
        "finish where they are. 'retire': retire the layouts no run in flight needs now "
        "(the orchestrators do it every 30 s). 'kept': the ended runs that keep retired "
        "layouts in the map.",
    )
    p.add_argument("--json", action="store_true")
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_partitions))
    verbs = p.add_subparsers(dest="partitions_verb", metavar="VERB")
    q = verbs.add_parser("set", help="spread new runs over N partitions (1 to 256)")
    q.add_argument("count", type=int, metavar="N")
    q.add_argument("--json", action="store_true")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_partitions_set))
    r = verbs.add_parser(
        "retire",
        help="retire the layouts no run in flight needs, forget those no stored run needs",
    )
    r.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long ago a layout must have been replaced (default 60: a process "
        "places runs by a map at most 5 s old; 0 only once every process has read the map)",
    )
    r.add_argument("--json", action="store_true")
    add_connection_flags(r)
    r.set_defaults(func=with_client(cmd_partitions_retire))
    k = verbs.add_parser(
        "kept",
        help="the ended runs that keep retired layouts in the map, one run id a line",
        description="Every stored run that is where no live layout places it: a retired "
        "layout stays in the map while one of these is stored. Delete them (interlock runs "
        "delete, with --archive-dir or --archive-bucket to keep a copy) and the next pass "
        "forgets those layouts. Changes nothing.",
    )
    k.add_argument("--json", action="store_true")
    add_connection_flags(k)
    k.set_defaults(func=with_client(cmd_partitions_kept))


async def cmd_partitions(client: Client, args: argparse.Namespace) -> int:
    from interlock.runtime.partitioning import partitions

    found, infos = await partitions(client.nc, client.subjects)
    if args.json:
        print_json(
            {
                "layouts": [
                    {"version": x.version, "count": x.count, "since": x.since, "retired": old}
                    for x, old in _layouts(found)
                ],
                "partitions": [
                    {
                        "partition": i.partition,
                        "stream": i.stream,
                        "placing": i.placing,
                        "relayed": i.relayed,
                        "leader": i.leader,
                        "peers": i.peers,
                        "messages": i.messages,
                        "owner": i.owner,
                    }
                    for i in infos
                ],
            }
        )
        return EXIT_OK
    current = found.current
    print(
        f"{current.count} partition{'s' if current.count != 1 else ''} (layout {current.version})"
    )
    rows = [("PARTITION", "STREAM", "NEW RUNS", "LEADER", "PEERS", "MESSAGES", "OWNER")]
    for i in infos:
        rows.append(
            (
                str(i.partition),
                i.stream,
                "yes" if i.placing else "no" if i.relayed else "retired",
                i.leader or "-",
                ",".join(i.peers) or "-",
                str(i.messages),
                i.owner or "-",
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if not found.single:
        print(
            "layouts: "
            + ", ".join(
                f"{x.version}: {x.count}" + (" (retired)" if old else "")
                for x, old in _layouts(found)
            )
        )
    return EXIT_OK


def _layouts(found: PartitionMap) -> list[tuple[Layout, bool]]:
    """Every layout of the map, oldest first, each with whether it is retired."""
    every = [(x, True) for x in found.retired] + [(x, False) for x in found.layouts]
    return sorted(every, key=lambda pair: pair[0].version)


async def cmd_partitions_set(client: Client, args: argparse.Namespace) -> int:
    from interlock.runtime.partitioning import set_partitions
    from interlock.transport.partitions import BadPartitionCount

    try:
        found, changed = await set_partitions(client.nc, client.subjects, args.count)
    except BadPartitionCount as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    current = found.current
    if args.json:
        print_json({"count": current.count, "version": current.version, "changed": changed})
    elif changed:
        print(
            f"new runs go to {_partitions(current.count)} (layout {current.version}); "
            "runs under way finish where they are"
        )
    else:
        print(f"already {_partitions(current.count)} (layout {current.version})")
    return EXIT_OK


def _partitions(count: int) -> str:
    return f"{count} partition{'s' if count != 1 else ''}"


async def cmd_partitions_retire(client: Client, args: argparse.Namespace) -> int:
    from interlock.runtime.layouts import RETIRE_GRACE_S, retire_layouts

    grace = RETIRE_GRACE_S if args.grace is None else args.grace
    if grace < 0:
        raise CliError(
            f"--grace is a number of seconds, 0 or more; {args.grace:g} is not", EXIT_USAGE
        )
    done = await retire_layouts(client.nc, client.subjects, grace=grace)
    if args.json:
        print_json(
            {
                "retired": [x.version for x in done.retired],
                "forgotten": [x.version for x in done.forgotten],
                "kept": {str(v): why for v, why in done.kept.items()},
                "layouts": [x.version for x in done.map.layouts],
                "retired_layouts": [x.version for x in done.map.retired],
            }
        )
        return EXIT_OK
    for x in done.retired:
        print(f"layout {x.version} ({x.count} partitions) retired: no run in flight needs it")
    for x in done.forgotten:
        print(f"layout {x.version} ({x.count} partitions) forgotten: no stored run needs it")
    for version, why in sorted(done.kept.items()):
        print(f"layout {version} kept: {why}")
    if not (done.retired or done.forgotten or done.kept):
        print("nothing to retire: one layout")
    return EXIT_OK


async def cmd_partitions_kept(client: Client, args: argparse.Namespace) -> int:
    from interlock.runtime.layouts import kept_by_runs

    kept = await kept_by_runs(client.nc, client.subjects)
    count = sum(len(runs) for runs in kept.values())
    if args.json:
        print_json({"layouts": {str(v): runs for v, runs in kept.items()}, "runs": count})
        return EXIT_OK
    for runs in kept.values():
        for run_id in runs:
            print(run_id)
    # The report on stderr: stdout is the run ids alone, for a pipe.
    if kept:
        versions = ", ".join(str(v) for v in kept)
        print(
            f"{count} ended run(s) keep layout(s) {versions} in the partition map: once they "
            "are deleted (interlock runs delete RUN_ID, --archive-dir DIR to keep a copy), the "
            "next pass forgets those layouts",
            file=sys.stderr,
        )
    else:
        print("no stored run keeps a retired layout", file=sys.stderr)
    return EXIT_OK
