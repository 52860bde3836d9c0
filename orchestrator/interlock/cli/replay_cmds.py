"""Debugging by replay: explain, replay --against, shadow, fork and migrate.

Each works on exported logs (``--file``) with manifest files alone, or against a server;
``--json`` prints the report documented in docs/debugging.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.cli import connecting, read_cmds
from interlock.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    err,
    print_json,
    read_sources,
)
from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.compiler import compile_sources
from interlock.core.definition import Definition, link
from interlock.core.state import fold
from interlock.core.vocabulary import RunStatus

if TYPE_CHECKING:
    from interlock.runtime.replaying import Replaying

    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parsers(sub: Sub) -> None:
    _add_explain(sub)
    _add_replay(sub)
    _add_shadow(sub)
    _add_fork(sub)
    _add_migrate(sub)


def _add_explain(sub: Sub) -> None:
    p = sub.add_parser(
        "explain",
        help="why a run went where it went: each guard weighed and the values it read",
        description="For each step of a run: the input, every `on` entry weighed with the "
        "values its guard read, the entry that fired or why none did, and what `set` and "
        "`outputs` produced; for a running run, what would move it now.",
    )
    p.add_argument("run_id", nargs="?", type=connecting.run_id_arg, help="the run (online)")
    p.add_argument("--file", help="a JSONL export of the run (offline)")
    p.add_argument(
        "--workflow",
        metavar="FILE",
        help="the manifest the run ran (required with --file; online: default the version "
        "the run names)",
    )
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument("--at", type=int, metavar="SEQ", help="only the step holding record SEQ")
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_explain)


def _add_replay(sub: Sub) -> None:
    p = sub.add_parser(
        "replay",
        help="fold a run's log step by step; with --against, what another definition "
        "would have done",
        description="Without --against: fold the log one record at a time, printing the "
        "state after each. With --against: re-drive the run's recorded inputs through "
        "another definition and report the first record where the logs diverge and why. "
        "Exit 0 when they agree, 1 when they diverge.",
    )
    p.add_argument("run_id", nargs="?", type=connecting.run_id_arg)
    p.add_argument("--file", help="a JSONL export (no server needed)")
    p.add_argument(
        "--against",
        metavar="FILE|WORKFLOW@VERSION",
        help="a manifest file, WORKFLOW@VERSION or VERSION (of the run's workflow) to compare",
    )
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument(
        "--json",
        action="store_true",
        help="JSON (one object per step without --against, the report with it)",
    )
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_replay)


def _add_shadow(sub: Sub) -> None:
    p = sub.add_parser(
        "shadow",
        help="replay recorded runs against a candidate manifest, grouped by divergence",
        description="Replay recorded runs of WORKFLOW against a candidate manifest: how "
        "many would end the same, which diverge, grouped by where and why with one example "
        "each. Exit 0 when every run agrees, 1 when some diverge.",
    )
    p.add_argument("workflow", help="NAME or NAMESPACE/NAME")
    p.add_argument("--candidate", required=True, metavar="FILE", help="the candidate manifest")
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--runs", type=int, metavar="N", help="the N most recent runs")
    which.add_argument("--since", metavar="TIME", help="runs started at or after TIME (RFC 3339)")
    p.add_argument(
        "--file",
        nargs="+",
        metavar="PATH",
        help="JSONL exports, or folders of them (offline)",
    )
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_shadow)


def _add_fork(sub: Sub) -> None:
    p = sub.add_parser(
        "fork",
        help="a new run from the first SEQ records of another, continuing live",
        description="Start a new run whose log begins with the first SEQ records of RUN_ID "
        "(marked as a fork of it), then enters the state the run was in at SEQ again, "
        "optionally on another version. The original is not touched.",
    )
    p.add_argument("run_id", nargs="?", type=connecting.run_id_arg)
    p.add_argument("--at", type=int, required=True, metavar="SEQ")
    p.add_argument(
        "--workflow",
        metavar="FILE|VERSION",
        help="go on under this manifest (applied first) or version (default: the run's)",
    )
    p.add_argument("--run-id", dest="new_run_id", help="the fork's run id (default: a new one)")
    p.add_argument("--file", help="fork an exported log offline; writes the fork's log")
    p.add_argument("-o", "--output", help="with --file: where to write the fork's log")
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_fork)


def _add_migrate(sub: Sub) -> None:
    p = sub.add_parser(
        "migrate",
        help="move running runs onto another version where their logs agree with it",
        description="Move the running runs of WORKFLOW onto VERSION when a replay finds "
        "their logs agree with it so far; list the others with the reason. Each move is a "
        "run.migrated record in the run's log. Exit 0 when every run moved (or would), 1 "
        "when some stay.",
    )
    p.add_argument("workflow", help="NAME or NAMESPACE/NAME")
    p.add_argument(
        "--to", required=True, metavar="VERSION|FILE", help="the version (offline: a manifest file)"
    )
    p.add_argument("--dry-run", action="store_true", help="check, write nothing")
    p.add_argument("--file", nargs="+", metavar="PATH", help="JSONL exports (offline, dry run)")
    p.add_argument("--agents", nargs="+", default=[], metavar="FILE", help="AgentDef files")
    p.add_argument("--json", action="store_true")
    connecting.add_connection_flags(p)
    p.set_defaults(func=cmd_migrate)


# -- reading logs and definitions -----------------------------------------------------------


def read_log(path: str) -> list[ev.AnyRecord]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        records = ev.decode_lines(data)
    except Exception as exc:
        raise CliError(f"{path}: not a run log: {exc}", EXIT_FAILED) from exc
    if not records:
        raise CliError(f"{path}: an empty log", EXIT_FAILED)
    return records


def manifest(path: str, agents: Sequence[str], name: str | None = None) -> Definition:
    """The one workflow in a manifest file, linked with the AgentDefs given."""
    compiled = compile_sources(read_sources([path]), agent_sources=read_sources(list(agents)))
    if not compiled.ok:
        for diagnostic in compiled.diagnostics:
            err(str(diagnostic))
        raise CliError(f"{path}: not a valid manifest", EXIT_FAILED)
    workflows = compiled.workflows
    if name is not None:
        short = name.rsplit("/", 1)[-1]
        workflows = [w for w in workflows if w.name == short] or workflows
    if len(workflows) != 1:
        raise CliError(f"{path}: holds {len(workflows)} workflows; give a file with one")
    capabilities = {
        cap_name: cap for agent in compiled.agents for cap_name, cap in agent.capabilities.items()
    }
    return link(workflows[0], capabilities) if capabilities else workflows[0]


def _online(args: argparse.Namespace) -> bool:
    return not getattr(args, "file", None)


def _replaying(client: Any) -> Replaying:
    from interlock.runtime.replaying import Replaying
    from interlock.runtime.runs import utc_now

    return Replaying(client.ops.log, client.ops.registry, utc_now)


async def _against(
    replaying: Replaying,
    records: Sequence[ev.AnyRecord],
    value: str,
    agents: Sequence[str],
    *,
    is_file: bool,
) -> tuple[Definition, int, str]:
    """A definition named on the command line: a file, WORKFLOW@VERSION or VERSION."""
    if is_file:
        definition = manifest(value, agents, fold(records).workflow)
        await replaying.load_capabilities()
        return replaying.registry.link(definition), 0, value
    try:
        return await replaying.named(records, value)
    except ValueError as exc:
        raise CliError(f"{value}: not a file, WORKFLOW@VERSION or VERSION") from exc


# -- explain ----------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace) -> int:
    if not _online(args):
        if not args.workflow:
            raise CliError("with --file, give the manifest the run ran: --workflow FILE")
        records = read_log(args.file)
        definition = manifest(args.workflow, args.agents, fold(records).workflow)
        return _explain(records, definition, args)
    if not args.run_id:
        raise CliError("give a RUN_ID or --file FILE", EXIT_USAGE)

    async def body(client: Any, a: argparse.Namespace) -> int:
        records = await client.ops.read(a.run_id)
        replaying = _replaying(client)
        if a.workflow:
            definition = replaying.registry.link(manifest(a.workflow, a.agents))
            return _explain(records, definition, a)
        try:
            report = await replaying.explain(records, at=a.at)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        return _print_explain(report, a)

    return connecting.with_client(body)(args)


def _explain(records: list[ev.AnyRecord], definition: Definition, args: argparse.Namespace) -> int:
    try:
        report = analysis.explain(records, definition, at=args.at)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    return _print_explain(report, args)


def _print_explain(report: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        print_json(report)
        return EXIT_OK
    out = sys.stdout.write
    w = report["workflow"]
    out(
        f"run {report['run_id']} ({w['namespace']}/{w['name']} v{w['version']}): "
        f"{report['status']}\n"
    )
    if not report["reproduces"]:
        m = report["mismatch"]
        out(
            f"note: this definition does not reproduce record {m['seq']} ({m['reason']}); "
            "explanations from there on are of the definition given\n"
        )
    for step in report["steps"]:
        out("\n" + _step_title(step) + "\n")
        for line in step["explanation"]:
            out(f"  {line}\n")
        fired = step["fired"]
        if fired is not None:
            sets = f", set {analysis.short(fired['set'])}" if fired["set"] else ""
            out(f"  => on[{fired['entry']}] fired: {fired['from']} -> {fired['to']}{sets}\n")
        elif step["input"]["kind"] != "start":
            out(f"  => no transition: {step['why_none']}\n")
        if step.get("context_writes"):
            out(f"  context writes: {analysis.short(step['context_writes'])}\n")
        if step.get("outputs"):
            out(f"  outputs: {analysis.short(step['outputs'])}\n")
        for line in step["records"]:
            out(f"    #{line['seq']:<3} {line['summary']}\n")
    waiting = report.get("waiting")
    if waiting is not None:
        if args.at is not None and report["steps"]:
            out(
                f"\nafter record {report['steps'][-1]['last']} the run waited in state "
                f"{waiting['state']}; it would move on:\n"
            )
        else:
            out(f"\nwaiting in state {waiting['state']}; it moves on:\n")
        for answer in waiting["answers"]:
            out(
                f"  an answer of {answer['capability']} (action {answer['action_id']}, "
                f"attempt {answer['attempt']}): {', '.join(answer['accepts'])}\n"
            )
        for event in waiting["events"]:
            for entry in event["entries"]:
                guard = f" if `{entry['guard']}`" if entry["guard"] else ""
                out(f"  event {event['type']}{guard} -> {entry['goto']}\n")
        for timer in waiting["timers"]:
            goto = f" -> {timer['goto']}" if timer.get("goto") else ""
            out(f"  timer {timer['purpose']} at {timer['fire_at']}{goto}\n")
    return EXIT_OK


def _step_title(step: dict[str, Any]) -> str:
    span = f"#{step['seq']}" + (f"-{step['last']}" if step["last"] != step["seq"] else "")
    inp = step["input"]
    where = f" in {step['state']}" if step["state"] else ""
    if inp["kind"] == "start":
        return f"{span} start, inputs {analysis.short(inp['inputs'])}"
    if inp["kind"] == "answer":
        return (
            f"{span} answer {inp['type']} to {inp['action_id']}{where}: "
            f"{analysis.short(inp['data'])}"
        )
    if inp["kind"] == "event":
        return f"{span} event {inp['type']} id={inp['id']}{where}: {analysis.short(inp['data'])}"
    if inp["kind"] == "timer":
        return f"{span} timer {inp['purpose']}{where}"
    return f"{span} {inp['kind']}{where}"


# -- replay --against -------------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    if not args.against:
        return read_cmds.cmd_replay(args)
    if not _online(args):
        records = read_log(args.file)
        if not Path(args.against).is_file():
            raise CliError("offline, --against takes a manifest file")
        definition = manifest(args.against, args.agents, fold(records).workflow)
        return _report_replay(analysis.replay(records, definition, label=args.against), args)
    if not args.run_id:
        raise CliError("give a RUN_ID or --file FILE", EXIT_USAGE)
    against_is_file = Path(args.against).is_file()

    async def body(client: Any, a: argparse.Namespace) -> int:
        records = await client.ops.read(a.run_id)
        definition, version, label = await _against(
            _replaying(client), records, a.against, a.agents, is_file=against_is_file
        )
        report = analysis.replay(records, definition, version=version, label=label)
        return _report_replay(report, a)

    return connecting.with_client(body)(args)


def _report_replay(report: dict[str, Any], args: argparse.Namespace) -> int:
    code = EXIT_OK if report["agree"] else EXIT_FAILED
    if args.json:
        print_json(report)
        return code
    out = sys.stdout.write
    against = report["against"]
    name = against["label"] or f"{against['namespace']}/{against['name']}"
    if report["agree"]:
        out(f"run {report['run_id']}: its {report['records']} records agree with {name}\n")
        return code
    d = report["divergence"]
    out(f"run {report['run_id']} diverges from {name} at record {d['seq']} ({d['kind']})\n")
    out(f"  {d['reason']}\n")
    if d["recorded"] is not None:
        out(f"  recorded: {analysis.summarize(ev.decode(_encode(d['recorded'])))}\n")
    if d["replayed"] is not None:
        out(f"  now:      {analysis.summarize(ev.decode(_encode(d['replayed'])))}\n")
    if report["continuation"]:
        out("the new run goes on, as far as the recorded inputs allow:\n")
        for line in report["continuation"]:
            out(f"    #{line['seq']:<3} {line['summary']}\n")
    for skip in report["skipped"]:
        out(f"  input of record {skip['seq']} not taken: {skip['reason']}\n")
    out(f"recorded end: {_end(report['recorded_end'])}\n")
    out(f"new end:      {_end(report['replayed_end'])}\n")
    return code


def _encode(value: Any) -> bytes:
    import json

    return json.dumps(value).encode()


def _end(end: dict[str, Any]) -> str:
    text = f"{end['status']} in {end['state']}"
    if "outputs" in end:
        text += f" outputs={analysis.short(end['outputs'])}"
    if "error" in end:
        text += f" ({end['error']['class']}: {end['error']['message']})"
    return text


# -- shadow -------------------------------------------------------------------------------------


def cmd_shadow(args: argparse.Namespace) -> int:
    candidate = manifest(args.candidate, args.agents, args.workflow)
    if not _online(args):
        # Which logs, chosen from their first lines; then read and replayed one at a time.
        chosen = _select(
            [(p, first) for p, first in _headed(args.file) if _started_of(first, args.workflow)],
            args.runs,
            args.since,
        )
        summary = analysis.Shadow(candidate, label=args.candidate)
        for path, _ in chosen:
            summary.add(read_log(path))
        return _report_shadow(summary.summary(), args)

    async def body(client: Any, a: argparse.Namespace) -> int:
        from interlock.runtime.replaying import select_runs

        chosen = select_runs(await client.ops.list_runs(a.workflow), a.runs, a.since)
        summary = await _replaying(client).shadow(chosen, candidate, label=a.candidate)
        return _report_shadow(summary, a)

    return connecting.with_client(body)(args)


def _headed(paths: Sequence[str]) -> list[tuple[str, ev.AnyRecord]]:
    """Each log file in ``paths`` (files, or folders of ``*.jsonl``) with its first record."""
    files: list[str] = []
    for path in paths:
        if Path(path).is_dir():
            files += sorted(str(p) for p in Path(path).glob("*.jsonl"))
        else:
            files.append(path)
    out = []
    for path in files:
        try:
            with Path(path).open("rb") as handle:
                first = handle.readline()
        except OSError as exc:
            raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        try:
            out.append((path, ev.decode(first)))
        except Exception as exc:
            raise CliError(f"{path}: not a run log: {exc}", EXIT_FAILED) from exc
    return out


def _started_of(first: ev.AnyRecord, ref: str) -> bool:
    if not isinstance(first, ev.RunStarted):
        return False
    d = first.data
    return ref in (d.workflow, f"{d.namespace}/{d.workflow}")


def _select(
    logs: list[tuple[str, ev.AnyRecord]], runs: int | None, since: str | None
) -> list[tuple[str, ev.AnyRecord]]:
    logs = sorted(logs, key=lambda item: item[1].time)
    if since:
        logs = [item for item in logs if item[1].time >= since]
    if runs is not None:
        logs = logs[-runs:] if runs else []
    return logs


def _report_shadow(summary: dict[str, Any], args: argparse.Namespace) -> int:
    code = EXIT_OK if summary["agree"] == summary["runs"] else EXIT_FAILED
    if args.json:
        print_json(summary)
        return code
    out = sys.stdout.write
    out(
        f"{summary['runs']} runs replayed against {args.candidate}: {summary['agree']} agree, "
        f"{summary['diverge']} diverge, {summary['same_end']} would end the same\n"
    )
    for group in summary["groups"]:
        ex = group["example"]
        out(
            f"\n{group['count']} run(s): {group['kind']}: {group['why']} "
            f"({group['same_end']} end the same)\n"
        )
        out(f"  e.g. {ex['run_id']} at record {ex['seq']}: {ex['reason']}\n")
        out(f"  recorded end: {_end(ex['recorded_end'])}; new end: {_end(ex['replayed_end'])}\n")
    for problem in summary["errors"]:
        out(f"\nnot replayed: {problem['run_id']}: {problem['error']}\n")
    return code


# -- fork -----------------------------------------------------------------------------------


def cmd_fork(args: argparse.Namespace) -> int:
    from interlock.runtime.client import new_run_id

    run_id = args.new_run_id or new_run_id()
    if not _online(args):
        return _fork_offline(args, run_id)
    if not args.run_id:
        raise CliError("give a RUN_ID or --file FILE", EXIT_USAGE)
    workflow_is_file = bool(args.workflow) and Path(args.workflow).is_file()

    async def body(client: Any, a: argparse.Namespace) -> int:
        from interlock.runtime.replaying import RunExistsAlready, parse_version

        replaying = _replaying(client)
        records = await client.ops.read(a.run_id)
        state = fold(records)
        definition: Definition | None = None
        version: int | None = None
        if a.workflow:
            number = parse_version(a.workflow)
            if number is not None and not workflow_is_file:
                version = number
                definition = await replaying.definition(state.namespace, state.workflow, number)
            else:
                result = await client.ops.apply(read_sources([a.workflow]))
                if not result.compiled.ok:
                    for diagnostic in result.compiled.diagnostics:
                        err(str(diagnostic))
                    raise CliError(f"{a.workflow}: not a valid manifest", EXIT_FAILED)
                applied = [x for x in result.applied if x.kind == "Workflow"]
                if len(applied) != 1:
                    raise CliError(f"{a.workflow}: give a file with one workflow")
                version = applied[0].version
                definition = await replaying.definition(
                    applied[0].namespace, applied[0].name, version
                )
        try:
            forked = await replaying.fork(
                records, a.at, run_id=run_id, definition=definition, version=version
            )
        except analysis.NotPossible as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        except RunExistsAlready as exc:
            raise CliError(str(exc), EXIT_FAILED) from exc
        return _report_fork(a.run_id, a.at, forked.run_id, forked.version, forked.records, a)

    return connecting.with_client(body)(args)


def _fork_offline(args: argparse.Namespace, run_id: str) -> int:
    records = read_log(args.file)
    state = fold(records)
    if args.workflow and Path(args.workflow).is_file():
        definition = manifest(args.workflow, args.agents, state.workflow)
    else:
        raise CliError("offline, give the manifest to go on under: --workflow FILE")
    version = state.version if definition.spec_hash == state.spec_hash else state.version + 1
    try:
        made = analysis.fork(
            records,
            args.at,
            run_id=run_id,
            definition=definition,
            version=version,
            now=_now(),
        )
    except analysis.NotPossible as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    lines = b"".join(ev.encode(r) + b"\n" for r in made)
    if args.output:
        read_cmds.write_atomically(Path(args.output), lines)
    elif not args.json:
        sys.stdout.buffer.write(lines)
        return EXIT_OK
    return _report_fork(records[0].subject, args.at, run_id, version, made, args)


def _now() -> str:
    from interlock.runtime.runs import utc_now

    return utc_now()


def _report_fork(
    origin: str,
    at: int,
    run_id: str,
    version: int,
    records: Sequence[ev.AnyRecord],
    args: argparse.Namespace,
) -> int:
    marker = next(r for r in records if isinstance(r, ev.RunForked))
    report: dict[str, Any] = {
        "run_id": run_id,
        "origin": {"run_id": origin, "seq": at},
        "version": version,
        "state": marker.data.state,
        "records": [analysis.record_line(i, r) for i, r in enumerate(records, start=1) if i > at],
    }
    if args.json:
        print_json(report)
        return EXIT_OK
    sys.stdout.write(
        f"forked {origin} at record {at} as {run_id} (version {version}); it goes on in "
        f"state {marker.data.state}\n"
    )
    for line in report["records"]:
        sys.stdout.write(f"    #{line['seq']:<3} {line['summary']}\n")
    return EXIT_OK


# -- migrate ---------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    if not _online(args):
        if not Path(args.to).is_file():
            raise CliError("offline, --to takes a manifest file")
        definition = manifest(args.to, args.agents, args.workflow)
        chosen = [p for p, first in _headed(args.file) if _started_of(first, args.workflow)]
        moved, stayed = [], []
        for path in chosen:
            records = read_log(path)
            target = fold(records).version + 1
            made, report = analysis.migration(records, definition, version=target, now=_now())
            state = fold(records)
            base = {
                "run_id": records[0].subject,
                "from_version": state.version,
                "state": state.state,
            }
            if made:
                moved.append({**base, "reason": None, "seq": state.seq + 1})
            elif state.status == RunStatus.RUNNING:
                out = {**base, "reason": report["migrate"]}
                if report["divergence"] is not None:
                    d = report["divergence"]
                    out["divergence"] = {k: d[k] for k in ("seq", "kind", "reason")}
                stayed.append(out)
        summary = {
            "workflow": {"name": definition.name, "namespace": definition.namespace},
            "to": {"version": None, "spec_hash": definition.spec_hash, "label": args.to},
            "dry_run": True,
            "moved": moved,
            "stayed": stayed,
        }
        return _report_migrate(summary, args)

    async def body(client: Any, a: argparse.Namespace) -> int:
        from interlock.runtime.replaying import in_flight, parse_version

        version = parse_version(a.to)
        if version is None:
            raise CliError(f"--to {a.to}: give a version number")
        replaying = _replaying(client)
        namespace, _, name = a.workflow.rpartition("/")
        definition = await replaying.definition(namespace or "default", name, version)
        running = in_flight(await client.ops.list_runs(a.workflow, "running"), version)
        summary = await replaying.migrate(running, definition, version, dry_run=a.dry_run)
        return _report_migrate(summary, a)

    return connecting.with_client(body)(args)


def _report_migrate(summary: dict[str, Any], args: argparse.Namespace) -> int:
    code = EXIT_OK if not summary["stayed"] else EXIT_FAILED
    if args.json:
        print_json(summary)
        return code
    out = sys.stdout.write
    to = summary["to"].get("version") or summary["to"].get("label")
    verb = "would move" if summary["dry_run"] else "moved"
    out(f"{len(summary['moved'])} run(s) {verb} to version {to}; {len(summary['stayed'])} stay\n")
    for run in summary["moved"]:
        out(f"  {verb}: {run['run_id']} (v{run['from_version']}, in {run['state']})\n")
    for run in summary["stayed"]:
        out(f"  stays: {run['run_id']} (v{run.get('from_version')}): {run['reason']}\n")
        if "divergence" in run:
            out(f"         {run['divergence']['reason']}\n")
    return code
