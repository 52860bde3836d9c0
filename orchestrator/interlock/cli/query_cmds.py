"""Looking things up: ``workflows``, ``get workflow|run|agent NAME``, ``describe run ID``,
and ``delete workflow NAME``.

They print the views of :mod:`interlock.views` (``--output json|yaml``) or tables.
"""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any

from interlock.cli.common import EXIT_FAILED, EXIT_OK, CliError, err
from interlock.cli.connecting import add_connection_flags, print_json, run_id_arg, with_client
from interlock.cli.output import add_output_flags, binary_size, emit, print_table
from interlock.core.vocabulary import RunStatus

if TYPE_CHECKING:
    from interlock.client import Client
    from interlock.views import AgentView, RunDescription, WorkflowDetail

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parsers(sub: Sub) -> None:
    p = sub.add_parser("workflows", help="list the workflows applied (newest versions)")
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_workflows))

    p = sub.add_parser("get", help="one workflow, run or agent")
    kinds = p.add_subparsers(dest="get_kind", metavar="KIND", required=True)
    for kind, what, func in (
        ("workflow", "NAME or NAMESPACE/NAME", cmd_get_workflow),
        ("run", "RUN_ID", cmd_get_run),
        ("agent", "an AgentDef's NAME", cmd_get_agent),
    ):
        q = kinds.add_parser(kind, help=f"one {kind}: {what}")
        q.add_argument(
            "name",
            metavar=what.split(" ")[-1] if kind == "agent" else what,
            type=run_id_arg if kind == "run" else str,
        )
        add_output_flags(q, default="yaml" if kind == "workflow" else "table")
        add_connection_flags(q)
        q.set_defaults(func=with_client(func))

    p = sub.add_parser("describe", help="everything about one run now")
    kinds = p.add_subparsers(dest="describe_kind", metavar="KIND", required=True)
    q = kinds.add_parser(
        "run",
        help="state, pending actions (attempts, deadlines), what it waits for, timers",
    )
    q.add_argument("run_id", metavar="RUN_ID", type=run_id_arg)
    add_output_flags(q)
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_describe_run))

    p = sub.add_parser(
        "queues", help="concurrency and rate limits: runs and requests at work and waiting, per key"
    )
    p.add_argument("--workflow", metavar="NAME", help="only the limits NAME declares")
    p.add_argument(
        "--capability", metavar="NAME", help="only the capability NAME's limits (each of them)"
    )
    p.add_argument("--limit", "-n", type=int, default=None, help="at most this many lines (a page)")
    p.add_argument("--after", metavar="TOKEN", help="the page after the one whose note gave TOKEN")
    add_output_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=with_client(cmd_queues))

    p = sub.add_parser("delete", help="stop a workflow from starting new runs")
    kinds = p.add_subparsers(dest="delete_kind", metavar="KIND", required=True)
    q = kinds.add_parser(
        "workflow", help="runs in flight keep running their version; apply to bring it back"
    )
    q.add_argument("name", metavar="NAME", help="NAME or NAMESPACE/NAME")
    q.add_argument("--json", action="store_true")
    add_connection_flags(q)
    q.set_defaults(func=with_client(cmd_delete_workflow))


async def cmd_workflows(client: Client, args: argparse.Namespace) -> int:
    found = await client.workflows()

    def table() -> None:
        if not found:
            print("no workflows (interlock apply FILE)")
            return
        print_table(
            ["WORKFLOW", "VERSION", "TRIGGERS", "DESCRIPTION"],
            [
                (
                    f"{w.namespace}/{w.name}",
                    w.version,
                    ",".join(w.triggers) or "-",
                    _one_line(w.description),
                )
                for w in found
            ],
        )
        for w in found:
            if w.paused is not None:
                with_runs = " with its runs in flight" if w.paused.runs else ""
                why = f": {w.paused.reason}" if w.paused.reason else ""
                since = f" since {w.paused.at}" if w.paused.at else ""
                print(
                    f"paused: {w.namespace}/{w.name}{with_runs}{since}{why} "
                    f"(its new runs wait until 'interlock resume workflow {w.namespace}/{w.name}')"
                )

    emit(args, found, table)
    return EXIT_OK


def _one_line(text: str | None, limit: int = 60) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


async def cmd_get_workflow(client: Client, args: argparse.Namespace) -> int:
    detail = await client.workflow(args.name)
    emit(args, detail, lambda: _workflow_table(detail))
    return EXIT_OK


def _workflow_table(w: WorkflowDetail) -> None:
    print(f"workflow     {w.namespace}/{w.name}")
    print(f"version      {w.version} (stored: {', '.join(map(str, w.versions))})")
    if w.description:
        print(f"description  {_one_line(w.description, 200)}")
    print(f"triggers     {', '.join(w.triggers) or '-'}")
    inputs = ", ".join(
        f"{name}: {spec.get('type', 'any')}{'' if spec.get('required') else '?'}"
        for name, spec in w.inputs.items()
    )
    print(f"inputs       {inputs or '-'}")
    print(f"states       {', '.join(w.states)} (starts in {w.initial_state})")


async def cmd_get_run(client: Client, args: argparse.Namespace) -> int:
    summary = await client.run(args.name)

    def table() -> None:
        print_table(
            ["RUN", "WORKFLOW", "STATUS", "STATE", "STARTED", "UPDATED"],
            [
                (
                    summary.run_id,
                    f"{summary.namespace}/{summary.workflow} v{summary.version}",
                    summary.status,
                    summary.state,
                    summary.started_at,
                    summary.updated_at,
                )
            ],
        )

    emit(args, summary, table)
    return EXIT_OK


async def cmd_get_agent(client: Client, args: argparse.Namespace) -> int:
    agent = await client.agent(args.name)
    emit(args, agent, lambda: _agent_table(agent))
    return EXIT_OK


def _agent_table(a: AgentView) -> None:
    print(f"agent  {a.name}")
    print_table(
        ["CAPABILITY", "WORKERS", "TIMEOUT", "RETRIES", "DESCRIPTION"],
        [
            (
                c.name,
                c.workers,
                f"{c.timeout_s:g}s" if c.timeout_s is not None else "-",
                c.max_retries if c.max_retries is not None else "-",
                _one_line(c.description),
            )
            for c in a.capabilities
        ],
    )
    for w in a.workers:
        print(
            f"worker {w.name}/{w.instance} host={w.host or '-'} pid={w.pid or '-'} "
            f"in_flight={w.in_flight} capabilities={','.join(w.capabilities)}"
        )


async def cmd_describe_run(client: Client, args: argparse.Namespace) -> int:
    described = await client.describe(args.run_id)
    emit(args, described, lambda: _describe_table(described))
    return EXIT_OK


def _describe_head(d: RunDescription) -> None:
    """Which run, its status and state, and the concurrency slots it holds or waits for."""
    print(f"run          {d.run_id}")
    print(f"workflow     {d.namespace}/{d.workflow} v{d.version}")
    status = d.status
    if d.error is not None:
        status += f" ({d.error.error_class}: {d.error.message})"
    elif d.reason:
        status += f" ({d.reason})"
    print(f"status       {status}")
    if d.paused is not None:
        with_workflow = " with its workflow" if d.paused.workflow else ""
        why = f": {d.paused.reason}" if d.paused.reason else ""
        print(f"paused       since {d.paused.at}{with_workflow}{why}")
        resume = f"workflow {d.namespace}/{d.workflow}" if d.paused.workflow else f"run {d.run_id}"
        print(f"{'':<12} {d.paused.held} event(s) held until 'interlock resume {resume}'")
    # A run queued before its first state is in none yet: say so rather than print nothing.
    waiting = d.status == RunStatus.RUNNING and (d.queued or d.rate is not None)
    print(f"state        {d.state or ('- (none yet: it is queued)' if waiting else '-')}")
    if d.rate is not None:
        r = d.rate
        print(
            f"{'queued':<12} until {r.until} by the rate of {r.trigger} for key {r.key!r} "
            f"({r.limit} per {r.per_s:g}s)"
        )
    for slot in _holding_it(d):
        print(f"{'queued' if d.queued else 'slot':<12} {slot_text(slot, d.queued)}")
    if d.window is not None:
        w = d.window
        print(
            f"{'window':<12} {w.kind} of {w.count} event(s) for key {w.key!r} of {w.trigger}, "
            f"opened {w.opened_at}, closed by {w.closed_by}: {', '.join(w.events)}"
        )


def _holding_it(d: RunDescription) -> list[Any]:
    """The slots to show: those the run holds, and what holds it. A run its workflow's
    pause holds waits for that alone (the limits' slots are asked for once it is resumed)."""
    if not d.queued:
        return [s for s in d.slots if s.holding]
    paused = [s for s in d.slots if s.limit.endswith("@paused") and not s.holding]
    if not paused:
        return list(d.slots)
    return [s for s in d.slots if s.holding or s in paused]


def _describe_table(d: RunDescription) -> None:
    import json

    def show(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)

    _describe_head(d)
    print(f"started      {d.started_at}")
    if d.forked_from is not None:
        o = d.forked_from
        since = f", which started {o.started_at}" if o.started_at else ""
        print(f"forked from  {o.run_id} at record {o.seq}{since}")
    print(f"updated      {d.updated_at} ({d.records} records)")
    if d.finished_at:
        print(f"finished     {d.finished_at}")
    if d.chain is not None:
        c = d.chain
        if c.previous:
            print(f"continues    {c.previous} (run {c.link + 1} of its chain; {c.reason})")
        if c.next:
            print(f"continued as {c.next}")
    if d.history is not None and (d.history.suggested or d.chain is not None):
        h = d.history
        limits = [f"{h.max_records:,} records"] if h.max_records is not None else []
        limits += [binary_size(h.max_bytes)] if h.max_bytes is not None else []
        limits[:1] = [f"at most {limits[0]}"] if limits else []
        print(
            f"history      {h.records:,} records ({binary_size(h.bytes)}) of "
            + " / ".join(limits or ["no limit"])
            + f" (continue_as_new: {h.continue_as_new})"
            + ("; continuing as new is suggested" if h.suggested else "")
        )
    if d.parent_run:
        print(f"parent run   {d.parent_run}")
    if d.correlation_key:
        print(f"correlation  {d.correlation_key}")
    if d.inputs:
        print(f"inputs       {show(d.inputs)}")
    if d.context:
        print(f"context      {show(d.context)}")
    if d.map is not None:
        m = d.map
        print(
            f"map          {m.done} of {m.items} done, {m.failed} failed "
            f"(parallelism {m.parallelism}, completion {m.completion})"
        )
    if d.pending:
        print("\npending actions")
        print_table(
            ["ACTION", "CAPABILITY", "ATTEMPT", "REQUESTED", "DEADLINE"],
            [
                (
                    p.action_id + (f" (item {p.item})" if p.item is not None else ""),
                    p.capability,
                    f"{p.attempt} of {p.max_attempts}",
                    p.requested_at,
                    p.deadline or (f"held: {p.held}" if p.held else "-"),
                )
                for p in d.pending
            ],
        )
    if d.waiting_for:
        print("\nwaits for")
        print_table(
            ["EVENT", "KIND", "GUARD", "GOTO"],
            [(w.event, w.kind, w.guard or "-", w.goto) for w in d.waiting_for],
        )
    if d.timers:
        print("\ntimers")
        print_table(
            ["TIMER", "PURPOSE", "FIRES AT"],
            [(t.timer_id, t.purpose, t.fire_at) for t in d.timers],
        )
    if d.guard_errors:
        _guard_errors_table(d)
    if d.outputs is not None:
        print(f"\noutputs      {show(d.outputs)}")
    for warning in d.warnings:
        print(f"\nwarning      {warning}")


def _guard_errors_table(d: RunDescription) -> None:
    print("\nguards that failed to evaluate (they do not fire)")
    print_table(
        ["STATE", "ENTRY", "EVENT", "GUARD", "ERROR", "THEN"],
        [
            (
                g.state,
                f"on[{g.transition}]",
                g.event_type,
                g.guard,
                g.error,
                "no entry taken"
                if g.taken is None
                else f"decided by this error: on[{g.taken}] -> {g.to_state}",
            )
            for g in d.guard_errors
        ],
    )


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def slot_text(slot: Any, queued: bool) -> str:
    """``3rd for key acme under default/limited#1 (2/2 running)`` (under a fair-share limit,
    ``3rd among acme's runs for key all under ...``: its place within its fairness key),
    or that it holds it."""
    if slot.limit.endswith("@paused"):  # interlock.core.pauses.PAUSED
        if slot.holding:
            return f"{slot.limit.removesuffix('@paused')} is resumed: it goes on in turn"
        place = "" if slot.place is None else f" ({ordinal(slot.place)} in line)"
        return f"until {slot.limit.removesuffix('@paused')} is resumed{place}"
    where = f"key {slot.key} under {slot.limit}"
    running = "" if slot.running is None else f" ({slot.running}/{slot.size} running)"
    if slot.holding:
        return f"holds a slot for {where}{running}"
    if queued and slot.place is not None:
        among = "" if not slot.fair else f" among {slot.fair}'s runs"
        return f"{ordinal(slot.place)}{among} for {where}{running}"
    return f"waits for a slot for {where}{running}"


async def cmd_queues(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import UnknownWorkflow
    from interlock.client.errors import UnknownAgent

    if args.limit is not None and args.limit < 1:
        raise CliError(f"--limit must be 1 or more, got {args.limit}")
    more = None
    try:
        if args.limit is None and args.after is None:
            found = await client.queues(args.workflow, capability=args.capability)
        else:
            found, more = await client.queue_page(
                args.workflow, capability=args.capability, limit=args.limit or ALL, after=args.after
            )
    except (UnknownWorkflow, UnknownAgent) as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    except ValueError as exc:
        raise CliError(f"--after: {exc}") from exc

    def table() -> None:
        if not found:
            print(
                "no run or request holds or waits for a limit, nothing is paused, "
                "and no trigger gathers events"
            )
            return
        print_table(
            ["LIMIT", "KEY", "RUNNING", "QUEUED", "OLDEST WAIT", "PAUSED"],
            [
                (
                    q.limit,
                    q.key or "-",
                    f"{q.running}/{q.size}",
                    q.queued,
                    "-" if q.oldest_wait_s is None else f"{q.oldest_wait_s:.1f}s",
                    _paused_text(q),
                )
                for q in found
            ],
        )

    emit(args, found, table)
    if more is not None:
        again = [
            f"--{o} {shlex.quote(v)}" for o in ("workflow", "capability") if (v := getattr(args, o))
        ]
        again += [f"--limit {args.limit}", f"--after {more}"]
        err(f"more lines: interlock queues {' '.join(again)}")
    return EXIT_OK


ALL = 1 << 30
"""``--after`` without ``--limit``: every line after it."""


def _paused_text(q: Any) -> str:
    """A queue line's PAUSED cell: ``since <time>: <reason>``, or ``-``."""
    if not q.paused:
        return "-"
    since = f"since {q.paused_since}" if q.paused_since else "paused"
    return f"{since}: {q.paused_reason}" if q.paused_reason else since


async def cmd_delete_workflow(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import UnknownWorkflow

    try:
        version = await client.delete_workflow(args.name)
    except UnknownWorkflow as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json({"workflow": args.name, "deleted_version": version})
    else:
        print(f"deleted workflow {args.name} (version {version}); runs in flight keep theirs")
        err("apply it again to start new runs")
    return EXIT_OK
