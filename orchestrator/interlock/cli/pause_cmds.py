"""pause and resume: a paused workflow's new runs wait until it is resumed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from interlock.cli.common import EXIT_FAILED, EXIT_OK, CliError
from interlock.cli.connecting import add_connection_flags, print_json, with_client

if TYPE_CHECKING:
    from interlock.client import Client

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parsers(sub: Sub) -> None:
    for verb, what, func in (
        ("pause", "new runs of a workflow wait (queued) until it is resumed", cmd_pause),
        ("resume", "the runs a paused workflow held go on, in order", cmd_resume),
    ):
        p = sub.add_parser(verb, help=what)
        kinds = p.add_subparsers(dest=f"{verb}_kind", metavar="KIND", required=True)
        q = kinds.add_parser("workflow", help=what)
        q.add_argument("name", metavar="NAME", help="NAME or NAMESPACE/NAME")
        if verb == "pause":
            q.add_argument("--reason", default="paused by an operator", help="recorded with it")
        q.add_argument("--json", action="store_true")
        add_connection_flags(q)
        q.set_defaults(func=with_client(func))


async def cmd_pause(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import UnknownWorkflow
    from interlock.client.queues import pause_workflow

    try:
        name = await pause_workflow(client.ops, args.name, args.reason)
    except UnknownWorkflow as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json({"workflow": name, "paused": True})
    else:
        print(f"paused {name}: its new runs wait until 'interlock resume workflow {name}'")
    return EXIT_OK


async def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import UnknownWorkflow
    from interlock.client.queues import resume_workflow

    try:
        name, was = await resume_workflow(client.ops, args.name)
    except UnknownWorkflow as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json({"workflow": name, "resumed": was})
    elif was:
        print(f"resumed {name}: the runs it held go on, in order")
    else:
        print(f"{name} was not paused")
    return EXIT_OK
