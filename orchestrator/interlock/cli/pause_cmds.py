"""pause and resume: a paused workflow's new runs wait until it is resumed; a paused run
takes no transition until it is resumed (the events that reach it are held); a paused
capability's requests wait, undispatched, until it is resumed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from interlock.cli.common import EXIT_FAILED, EXIT_OK, CliError
from interlock.cli.connecting import add_connection_flags, print_json, with_client

if TYPE_CHECKING:
    from interlock.client import Client

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


_DEFAULT = "paused by an operator"


def _reason(text: str) -> str:
    """A pause's reason: refused (exit 2) past :data:`MAX_REASON` characters, as over
    HTTP, where it was kept whole with the pause and recorded in every run it held."""
    from interlock.core.pauses import check_reason

    try:
        return check_reason(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


VERB_HELP = {
    "pause": "hold a workflow's new runs, a run, or a capability's requests, until resumed",
    "resume": "let what a paused workflow, run or capability held go on, in order",
}


def add_parsers(sub: Sub) -> None:
    capability_what = {
        "pause": "nothing more of a capability is dispatched until it is resumed",
        "resume": "the requests a paused capability held go on, in order",
    }
    capability_func = {"pause": cmd_pause_cap, "resume": cmd_resume_cap}
    for verb, what, run_what, func, run_func in (
        (
            "pause",
            "new runs of a workflow wait (queued) until it is resumed",
            "a run takes no transition until it is resumed (events reaching it are held)",
            cmd_pause,
            cmd_pause_run,
        ),
        (
            "resume",
            "the runs a paused workflow held go on, in order",
            "a paused run goes on: the events it held are decided on, in order",
            cmd_resume,
            cmd_resume_run,
        ),
    ):
        p = sub.add_parser(verb, help=VERB_HELP[verb])
        kinds = p.add_subparsers(dest=f"{verb}_kind", metavar="KIND", required=True)
        q = kinds.add_parser("workflow", help=what)
        q.add_argument("name", metavar="NAME", help="NAME or NAMESPACE/NAME")
        if verb == "pause":
            q.add_argument("--reason", type=_reason, default=_DEFAULT, help="recorded with it")
            q.add_argument(
                "--runs",
                action="store_true",
                help="its runs in flight are paused too (resuming the workflow resumes them)",
            )
        q.add_argument("--json", action="store_true")
        add_connection_flags(q)
        q.set_defaults(func=with_client(func))
        r = kinds.add_parser("run", help=run_what)
        r.add_argument("run_id", metavar="ID", help="the run's id")
        if verb == "pause":
            r.add_argument("--reason", type=_reason, default=_DEFAULT, help="recorded with it")
        r.add_argument("--json", action="store_true")
        add_connection_flags(r)
        r.set_defaults(func=with_client(run_func))
        c = kinds.add_parser("capability", help=capability_what[verb])
        c.add_argument("name", metavar="NAME", help="the capability (dot-separated words)")
        if verb == "pause":
            c.add_argument("--reason", type=_reason, default=_DEFAULT, help="recorded with it")
        c.add_argument("--json", action="store_true")
        add_connection_flags(c)
        c.set_defaults(func=with_client(capability_func[verb]))


async def cmd_pause(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import UnknownWorkflow
    from interlock.client.queues import pause_workflow

    try:
        name, runs, already = await pause_workflow(
            client.ops, args.name, args.reason, runs=args.runs
        )
    except UnknownWorkflow as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json({"workflow": name, "paused": True, "changed": already is None, "runs": runs})
        return EXIT_OK
    if already is not None:
        print(f"{name} is paused already (since {already.get('at')}: {already.get('reason')})")
    else:
        print(f"paused {name}: its new runs wait until 'interlock resume workflow {name}'")
    if args.runs:
        print(f"paused {len(runs)} run(s) in flight with it")
    return EXIT_OK


async def cmd_resume(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import UnknownWorkflow
    from interlock.client.queues import resume_workflow

    try:
        name, was, runs = await resume_workflow(client.ops, args.name)
    except UnknownWorkflow as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json({"workflow": name, "resumed": was, "runs": runs})
        return EXIT_OK
    if was:
        print(f"resumed {name}: the runs it held go on, in order")
    else:
        print(f"{name} was not paused")
    if runs:
        print(f"resumed {len(runs)} run(s) paused with it")
    return EXIT_OK


async def cmd_pause_run(client: Client, args: argparse.Namespace) -> int:
    # No such run: `interlock: no run 'ID'`, exit 4, as every command that names a run.
    done = await client.pause_run(args.run_id, args.reason)
    if args.json:
        print_json({"run_id": args.run_id, "paused": True, "changed": done})
    elif done:
        print(f"paused run {args.run_id}: it holds what reaches it until resumed")
    else:
        state = await client.state(args.run_id)
        if state.paused is not None:
            print(f"run {args.run_id} is paused already (since {state.paused.at})")
        else:
            print(f"run {args.run_id} was not paused: it has ended ({state.status})")
    return EXIT_OK


async def cmd_resume_run(client: Client, args: argparse.Namespace) -> int:
    done = await client.resume_run(args.run_id)
    if args.json:
        print_json({"run_id": args.run_id, "paused": False, "changed": done})
    elif done:
        print(f"resumed run {args.run_id}: what it held is decided on, in order")
    else:
        print(f"run {args.run_id} was not paused")
    return EXIT_OK


async def cmd_pause_cap(client: Client, args: argparse.Namespace) -> int:
    from interlock.client.capqueues import pause_capability
    from interlock.client.errors import UnknownAgent

    try:
        already = await pause_capability(client.ops, args.name, args.reason)
    except UnknownAgent as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    name = args.name
    if args.json:
        print_json({"capability": name, "paused": True, "changed": already is None})
    elif already is not None:
        print(
            f"capability {name} is paused already (since {already.get('at')}: "
            f"{already.get('reason')})"
        )
    else:
        print(
            f"paused capability {name}: its requests wait, undispatched, until "
            f"'interlock resume capability {name}' (those already sent go on)"
        )
    return EXIT_OK


async def cmd_resume_cap(client: Client, args: argparse.Namespace) -> int:
    from interlock.client.capqueues import resume_capability
    from interlock.client.errors import UnknownAgent

    try:
        was = await resume_capability(client.ops, args.name)
    except UnknownAgent as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json({"capability": args.name, "paused": False, "changed": was})
    elif was:
        print(f"resumed capability {args.name}: the requests it held go on, in order")
    else:
        print(f"capability {args.name} was not paused")
    return EXIT_OK
