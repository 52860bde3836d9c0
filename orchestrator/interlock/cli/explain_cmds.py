"""``interlock explain`` and ``interlock replay --against``: one run's log read against a
definition, to say why it went where it went or where another definition would part from it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from interlock.cli import connecting, read_cmds
from interlock.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, err, print_json
from interlock.cli.replay_inputs import (
    definition_against,
    end_text,
    is_online,
    manifest,
    read_log,
    reference_agentdefs,
    replaying_of,
)
from interlock.core import analysis
from interlock.core import events as ev
from interlock.core.definition import Definition
from interlock.core.state import fold


def cmd_explain(args: argparse.Namespace) -> int:
    if not is_online(args):
        if not args.workflow:
            raise CliError("with --file, give the manifest the run ran: --workflow FILE")
        records = read_log(args.file)
        definition = manifest(args.workflow, args.agents, fold(records).workflow)
        return _explain(records, definition, args, offline=True)
    if not args.run_id:
        raise CliError("give a RUN_ID or --file FILE", EXIT_USAGE)

    async def body(client: Any, a: argparse.Namespace) -> int:
        # Payloads kept by reference loaded, as the run decided on them (and as export
        # writes them): a reference is not the value it stands for.
        records = await client.records(a.run_id)
        replaying = replaying_of(client)
        if a.workflow:
            definition = replaying.registry.link(manifest(a.workflow, a.agents))
            return _explain(records, definition, a)
        try:
            report = await replaying.explain(records, at=a.at)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        return _print_explain(report, a)

    return connecting.with_client(body)(args)


def _explain(
    records: list[ev.AnyRecord],
    definition: Definition,
    args: argparse.Namespace,
    *,
    offline: bool = False,
) -> int:
    try:
        report = analysis.explain(records, definition, at=args.at)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    code = _print_explain(report, args)
    if offline and not report["reproduces"]:
        _no_agents_note(definition, args)
    return code


def _no_agents_note(definition: Definition, args: argparse.Namespace) -> None:
    """Offline, a manifest given without its AgentDefs: the capabilities' own timeouts,
    retries and limits are not known, so the records they shaped differ. Say so, and
    which files to give: the reference agents' AgentDefs ship with Interlock."""
    if args.agents or not definition.capabilities():
        return
    used = sorted(definition.capabilities())
    files = reference_agentdefs(used)
    served = {c for caps in files.values() for c in caps}
    where = " ".join(f"--agents {path}" for path in files)
    others = [c for c in used if c not in served]
    hint = f"give {where}" if where else ""
    if others:
        hint += (" and " if hint else "give ") + (
            f"--agents FILE with the AgentDef serving {', '.join(others)}, as it was applied"
        )
    err(
        "note: no AgentDef given (--agents FILE): the timeouts, retries and limits the "
        f"run's capabilities ({', '.join(used)}) declare are not known, and the records "
        f"they shaped differ; {hint}"
    )


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
    chain = report.get("chain") or {}
    if chain.get("previous"):
        out(
            f"it continues run {chain['previous']} (run {chain['link'] + 1} of its chain: "
            f"interlock explain {chain['previous']})\n"
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
    if chain.get("next"):
        # With --at, the steps shown end before the run's end: its continuation came later.
        where = "from its end" if args.at is not None else "from here"
        out(
            f"\n{'later, it ' if args.at is not None else ''}continued as new: run "
            f"{chain['next']} goes on {where} (interlock explain {chain['next']})\n"
        )
    waiting = report.get("waiting")
    if waiting is not None:
        where = f"in state {waiting['state']}" if waiting["state"] else "before its first state"
        if args.at is not None and report["steps"]:
            out(
                f"\nafter record {report['steps'][-1]['last']} the run waited {where}; "
                "it would move on:\n"
            )
        else:
            out(f"\nwaiting {where}; it moves on:\n")
        queued = waiting.get("queued")
        if queued is not None:
            out(
                f"  its admission: #{queued['seq']} {queued['summary']} (interlock describe "
                f"run {report['run_id']} shows where it stands)\n"
            )
        if waiting.get("held_until") == "admitted":
            out("  (queued for its slots: what reaches it is held until it is admitted)\n")
        elif waiting.get("held_until") == "resumed":
            out("  (paused: what reaches it is held until it is resumed)\n")
        for answer in waiting["answers"]:
            held = f", held: {answer['held']}" if answer.get("held") else ""
            out(
                f"  an answer of {answer['capability']} (action {answer['action_id']}, "
                f"attempt {answer['attempt']}{held}): {', '.join(answer['accepts'])}\n"
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


def cmd_replay(args: argparse.Namespace) -> int:
    if not args.against:
        return read_cmds.cmd_replay(args)
    if not is_online(args):
        records = read_log(args.file)
        if not Path(args.against).is_file():
            raise CliError("offline, --against takes a manifest file")
        definition = manifest(args.against, args.agents, fold(records).workflow)
        report = analysis.replay(records, definition, label=args.against)
        code = _report_replay(report, args)
        if not report["agree"]:
            _no_agents_note(definition, args)
        return code
    if not args.run_id:
        raise CliError("give a RUN_ID or --file FILE", EXIT_USAGE)
    against_is_file = Path(args.against).is_file()

    async def body(client: Any, a: argparse.Namespace) -> int:
        records = await client.records(a.run_id)
        definition, version, label = await definition_against(
            replaying_of(client), records, a.against, a.agents, is_file=against_is_file
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
    out(f"recorded end: {end_text(report['recorded_end'])}\n")
    out(f"new end:      {end_text(report['replayed_end'])}\n")
    return code


def _encode(value: Any) -> bytes:
    import json

    return json.dumps(value).encode()
