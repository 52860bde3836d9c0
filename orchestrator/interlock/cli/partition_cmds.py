"""partitions: the run-log partitions of an installation, shown and changed live."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from interlock.cli.common import EXIT_OK, EXIT_USAGE, CliError
from interlock.cli.connecting import add_connection_flags, print_json, with_client

if TYPE_CHECKING:
    from interlock.client import Client

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parsers(sub: Sub) -> None:
    p = sub.add_parser(
        "partitions",
        help="the run-log partitions: layout, leaders, owners; set N changes P live",
        description="Without a verb: each partition's stream, its leader and peers, its "
        "messages and the orchestrator replica that relays it, and the layouts of the "
        "partition map. 'set N': new runs go to N partitions from now on; runs under way "
        "finish where they are.",
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


async def cmd_partitions(client: Client, args: argparse.Namespace) -> int:
    from interlock.runtime.partitioning import partitions

    found, infos = await partitions(client.nc, client.subjects)
    if args.json:
        print_json(
            {
                "layouts": [
                    {"version": x.version, "count": x.count, "since": x.since}
                    for x in found.layouts
                ],
                "partitions": [
                    {
                        "partition": i.partition,
                        "stream": i.stream,
                        "placing": i.placing,
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
                "yes" if i.placing else "no",
                i.leader or "-",
                ",".join(i.peers) or "-",
                str(i.messages),
                i.owner or "-",
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if len(found.layouts) > 1:
        print("layouts: " + ", ".join(f"{x.version}: {x.count}" for x in found.layouts))
    return EXIT_OK


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
            f"new runs go to {current.count} partitions (layout {current.version}); "
            "runs under way finish where they are"
        )
    else:
        print(f"already {current.count} partitions (layout {current.version})")
    return EXIT_OK
