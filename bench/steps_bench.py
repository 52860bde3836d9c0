"""Where the microseconds of one run go, timed inside the processes, step by step.

Runs ``bench/peers/interlock_bench.py`` (nats-server, ``interlock serve`` and its worker
``interlock agent run``, started as that benchmark starts them; the approval workload:
trigger, ``review`` task, CEL guard, ``merge`` task, completion) for N runs one after
another, after a warm-up, with the tracer of ``bench/steps_tracer`` on the ``PYTHONPATH``
of its processes: the driver, the orchestrator and the worker each time every chunk they
read from or write to their NATS connection (``time.perf_counter_ns``, one monotonic clock
for every process of the machine). The NATS protocol's messages are found in those chunks
afterwards and matched run by run: by the trigger's CloudEvent id, the run id of the run
log's subject, the ``ce-runid`` header of a task, the run id in an answer's subject and the
reply inbox of each request. Each step of the run's critical path is the time from one such
message to the next; the process it is spent in is the one that read the first and wrote
the second, else ``server/wire`` (the other process's write, the server, and the reading
process until its read returns). Runs a step of which was not found are counted, by the
first message missing, and left out.

Unlike ``python -m bench hops`` (a subscriber on every subject, timing messages as the
server copies them to it), this sees each process's own reads and writes, with no extra
subscriber on the server.

``--baseline-venv <other checkout>/.venv`` runs the same with that venv's Interlock
(the same driver, this checkout's ``interlock_bench.py``), rounds alternating, and prints
both side by side with their ratio per step. ``--wrap module:Class.function,...`` also
times each call of those functions in the processes that import them.

    python -m bench steps [--runs 500] [--warmup 50] [--rounds R]
                          [--baseline-venv OTHER/.venv] [--wrap module:Class.function,...]
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
TRACER = HERE / "steps_tracer"
TIMEOUT_S = 900

ORCHESTRATOR, WORKER, WIRE = "orchestrator", "worker", "server/wire"
STEPS: tuple[tuple[str, str], ...] = (
    ("trigger written (driver) -> read by the ingress", WIRE),
    ("ingress: trigger -> registry check written", ORCHESTRATOR),
    ("registry check -> its answer read", WIRE),
    ("answer read -> start appended (append 1 written)", ORCHESTRATOR),
    ("append 1 -> its ack read", WIRE),
    ("ack 1 -> task 1 written", ORCHESTRATOR),
    ("task 1 -> read by the worker", WIRE),
    ("worker: task 1 -> answer 1 request written", WORKER),
    ("answer 1 -> read by the orchestrator", WIRE),
    ("answer 1 -> append 2 written", ORCHESTRATOR),
    ("append 2 -> its ack read", WIRE),
    ("ack 2 -> task 2 written", ORCHESTRATOR),
    ("task 2 -> read by the worker", WIRE),
    ("worker: task 2 -> answer 2 request written", WORKER),
    ("answer 2 -> read by the orchestrator", WIRE),
    ("answer 2 -> append 3 (completion) written", ORCHESTRATOR),
    ("append 3 -> completion read by the driver", WIRE),
)
"""Each step of a run's critical path and where it is spent."""
POINTS = (
    "trigger written",
    "trigger read",
    "check written",
    "check answer read",
    "append 1 written",
    "ack 1 read",
    "task 1 written",
    "task 1 read",
    "answer 1 written",
    "answer 1 read",
    "append 2 written",
    "ack 2 read",
    "task 2 written",
    "task 2 read",
    "answer 2 written",
    "answer 2 read",
    "append 3 written",
    "completion read",
)
"""The messages whose times bound the steps, in order."""

_EVENTS = re.compile(r".+?\.events\..+")
_RUNS = re.compile(r".+?\.runs\.([^.]+)")
_CAP = re.compile(r".+?\.cap\.([^.]+)")
_ANSWER = re.compile(r".+?\.answer\.([^.]+)\.([^.]+)")
_CHECK = re.compile(r"\$JS\.API\.STREAM\.(?:MSG\.GET|INFO)\.KV_\w*workflows")
"""The ingress's registry check: a stored-message get (a stream info before)."""
_JSON_ID = re.compile(rb'"id"\s*:\s*"([^"]*)"')


@dataclass(frozen=True)
class Msg:
    """A NATS message a process wrote (``out``) or read, at ``t`` (ns)."""

    t: int
    out: bool
    subject: str
    reply: str
    run_id: str  # its ce-runid header
    event_id: str  # an event's CloudEvent id; a run-log append's trigger id
    completed: bool  # a run-log append with the run's completion


@dataclass
class Trace:
    """One process's trace: its messages in time order, its wrapped calls, its notes."""

    role: str
    msgs: list[Msg] = field(default_factory=list)
    calls: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _headers(block: bytes) -> dict[str, str]:
    out = {}
    for line in block.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


def _msg(t: int, out: bool, line: list[bytes], hdr: bytes, payload: bytes) -> Msg:
    verb = line[0].upper()
    subject = line[1].decode("latin-1")
    # MSG subj sid [reply] n, HMSG subj sid [reply] h n, PUB subj [reply] n, HPUB subj [reply] h n
    fixed, at = {b"MSG": (4, 3), b"HMSG": (5, 3), b"PUB": (3, 2), b"HPUB": (4, 2)}[verb]
    reply = line[at].decode("latin-1") if len(line) > fixed else ""
    headers = _headers(hdr) if hdr else {}
    event_id, completed = "", False
    if _EVENTS.fullmatch(subject):
        event_id = headers.get("ce-id", "")
        if not event_id and (m := _JSON_ID.search(payload)):
            event_id = m.group(1).decode("latin-1")
    elif _RUNS.fullmatch(subject):
        completed = b"run.completed" in payload
        at = payload.find(b'"trigger"')
        if at >= 0 and (m := _JSON_ID.search(payload, at)):
            event_id = m.group(1).decode("latin-1")
    return Msg(t, out, subject, reply, headers.get("ce-runid", ""), event_id, completed)


def parse_stream(chunks: list[tuple[int, bytes]], out: bool) -> list[Msg]:
    """The messages (MSG, HMSG, PUB, HPUB) of one connection's bytes in one direction, each
    at the time of the chunk that completed it; other protocol lines are skipped."""
    buf = bytearray()
    msgs: list[Msg] = []
    for t, data in chunks:
        buf += data
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line = bytes(buf[pos:eol]).split()
            verb = line[0].upper() if line else b""
            if verb not in (b"MSG", b"HMSG", b"PUB", b"HPUB"):
                pos = eol + 2
                continue
            try:
                total = int(line[-1])
                hlen = int(line[-2]) if verb in (b"HMSG", b"HPUB") else 0
            except (ValueError, IndexError):
                pos = eol + 2
                continue
            end = eol + 2 + total
            if end + 2 > len(buf):
                break  # the rest comes in a later chunk
            body = bytes(buf[eol + 2 : end])
            msgs.append(_msg(t, out, line, body[:hlen], body[hlen:]))
            pos = end + 2
        del buf[:pos]
    return msgs


def read_trace(path: Path) -> Trace:
    """A trace file of ``bench/steps_tracer``."""
    role = path.name.split("-", 1)[0]
    raw = path.read_bytes()
    streams: dict[tuple[bool, int], list[tuple[int, bytes]]] = defaultdict(list)
    trace = Trace(role)
    open_calls: dict[str, list[int]] = defaultdict(list)
    pos = 0
    while pos < len(raw):
        eol = raw.index(b"\n", pos)
        t_s, kind, stream, size = raw[pos:eol].split()
        t, n = int(t_s), int(size)
        data = raw[eol + 1 : eol + 1 + n]
        pos = eol + 1 + n
        if kind in (b"r", b"w"):
            streams[(kind == b"w", int(stream))].append((t, data))
        elif kind == b">":
            open_calls[data.decode()].append(t)
        elif kind == b"<":
            name = data.decode()
            if open_calls[name]:
                trace.calls.setdefault(name, []).append((open_calls[name].pop(), t))
        elif kind == b"i":
            trace.notes.append(data.decode(errors="replace"))
    for (out, _), chunks in streams.items():
        trace.msgs.extend(parse_stream(chunks, out))
    trace.msgs.sort(key=lambda m: m.t)
    return trace


@dataclass
class Matched:
    """The runs of one round: each counted run's points (ns), and why others were not."""

    runs: list[list[int]] = field(default_factory=list)
    missing: dict[str, int] = field(default_factory=dict)
    triggers: int = 0
    span: tuple[int, int] = (0, 0)
    """From the completion of the run before the first counted one to the last's."""


def match_runs(traces: dict[str, Trace], skip: int) -> Matched:
    """Every run the driver triggered, but its first ``skip``, matched message by message."""
    driver, orch, worker = (
        traces.get(r, Trace(r)).msgs for r in ("driver", "orchestrator", "worker")
    )
    triggers = sorted(
        (m.t, m.event_id) for m in driver if m.out and m.event_id and _EVENTS.fullmatch(m.subject)
    )
    completed: dict[str, int] = {}
    for m in driver:
        if not m.out and m.completed and (r := _RUNS.fullmatch(m.subject)):
            completed.setdefault(r.group(1), m.t)
    event_read: dict[str, int] = {}
    run_of: dict[str, str] = {}
    appends: dict[str, list[Msg]] = defaultdict(list)
    tasks_out: dict[str, list[int]] = defaultdict(list)
    answers_in: dict[str, list[int]] = defaultdict(list)
    replies: dict[str, int] = {}
    checks: list[Msg] = []
    for m in orch:
        if not m.out:
            if m.event_id and _EVENTS.fullmatch(m.subject):
                event_read.setdefault(m.event_id, m.t)
            elif a := _ANSWER.fullmatch(m.subject):
                answers_in[a.group(2)].append(m.t)
            else:
                replies.setdefault(m.subject, m.t)
        elif r := _RUNS.fullmatch(m.subject):
            appends[r.group(1)].append(m)
            if m.event_id:
                run_of.setdefault(m.event_id, r.group(1))
        elif _CAP.fullmatch(m.subject) and m.run_id:
            tasks_out[m.run_id].append(m.t)
        elif _CHECK.fullmatch(m.subject):
            checks.append(m)
    check_times = [m.t for m in checks]
    tasks_in: dict[str, list[int]] = defaultdict(list)
    answers_out: dict[str, list[int]] = defaultdict(list)
    for m in worker:
        if not m.out and m.run_id and _CAP.fullmatch(m.subject):
            tasks_in[m.run_id].append(m.t)
        elif m.out and (a := _ANSWER.fullmatch(m.subject)):
            answers_out[a.group(2)].append(m.t)

    result = Matched(triggers=max(0, len(triggers) - skip))
    if len(triggers) > skip:
        before = completed.get(run_of.get(triggers[skip - 1][1], ""), 0) if skip else 0
        last = completed.get(run_of.get(triggers[-1][1], ""), 0)
        result.span = (before or triggers[skip][0], last or triggers[-1][0])
    for t0, event_id in triggers[skip:]:
        points: list[int | None] = [t0, event_read.get(event_id)]
        run_id = run_of.get(event_id, "")
        logged = appends.get(run_id, [])
        if points[1] is not None and logged:
            i = bisect.bisect_left(check_times, points[1])
            check = checks[i] if i < len(checks) and checks[i].t <= logged[0].t else None
            points += [check.t if check else None, replies.get(check.reply) if check else None]
        else:
            points += [None, None]
        for k in range(3):
            append = logged[k] if k < len(logged) else None
            points.append(append.t if append else None)
            if k == 2:
                break
            points.append(replies.get(append.reply) if append and append.reply else None)
            for times in (tasks_out, tasks_in, answers_out, answers_in):
                got = times.get(run_id, [])
                points.append(got[k] if k < len(got) else None)
        points.append(completed.get(run_id))
        if None in points:
            why = POINTS[points.index(None)]
            result.missing[why] = result.missing.get(why, 0) + 1
            continue
        result.runs.append([p for p in points if p is not None])
    return result


@dataclass
class Round:
    label: str
    matched: Matched
    calls: dict[tuple[str, str], list[tuple[int, int]]]
    notes: list[str]
    driver_line: str


def run_round(python: Path, label: str, args: argparse.Namespace, base: bool) -> Round:
    """One run of interlock_bench.py with the tracer; its traces matched."""
    with tempfile.TemporaryDirectory(prefix="interlock-steps-") as tmp:
        out = Path(tmp) / "traces"
        out.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(
            PYTHONPATH=str(TRACER),
            BENCH_STEPS_OUT=str(out),
            BENCH_STEPS_WRAP=args.wrap or "",
            PEERS=tmp,
            PEERS_RESULTS=str(Path(tmp) / "results"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        cmd = [str(python), "interlock_bench.py", "--label", label, "--tp-runs", "0"]
        cmd += ["--warmup", str(args.warmup), "--seq", str(args.runs), "--fsync", args.fsync]
        if base:
            cmd += ["--system", "interlock-base"]
        done = subprocess.run(
            cmd, cwd=PEERS, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
            raise RuntimeError(f"{' '.join(cmd)} failed:\n  " + "\n  ".join(tail))
        line = next((s for s in done.stdout.splitlines() if s.startswith("sequential")), "")
        traces: dict[str, Trace] = {}
        for path in sorted(out.glob("*.trace")):
            trace = read_trace(path)
            traces[trace.role] = trace
        lost = {"driver", "orchestrator", "worker"} - traces.keys()
        if lost:
            raise RuntimeError(f"no trace from {', '.join(sorted(lost))} (stdout: {done.stdout})")
    matched = match_runs(traces, skip=1 + args.warmup)
    span = matched.span
    calls = {
        (role, name): [c for c in got if span[0] <= c[0] <= span[1]]
        for role, trace in traces.items()
        for name, got in trace.calls.items()
    }
    notes = [f"{role}: {n}" for role, trace in traces.items() for n in trace.notes]
    return Round(label, matched, calls, notes, line.strip())


def step_values(rounds: list[Round]) -> list[list[float]]:
    """Per step, its microseconds in every counted run of these rounds."""
    out: list[list[float]] = [[] for _ in STEPS]
    for r in rounds:
        for points in r.matched.runs:
            for i in range(len(STEPS)):
                out[i].append((points[i + 1] - points[i]) / 1000)
    return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """Median, 25th and 75th percentile (nan for no values)."""
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v, v
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[1], q[0], q[2]


def _whole(rounds: list[Round]) -> list[float]:
    return [(p[-1] - p[0]) / 1000 for r in rounds for p in r.matched.runs]


def _runs_line(rounds: list[Round], wanted: int) -> str:
    parts = []
    for r in rounds:
        m = r.matched
        text = f"{len(m.runs)}/{wanted}"
        if m.triggers != wanted:
            text += f" ({m.triggers} triggers seen)"
        if m.missing:
            text += " unmatched: " + ", ".join(f"{n} no {what!r}" for what, n in m.missing.items())
        parts.append(text)
    return "; ".join(parts)


def report(this: list[Round], base: list[Round] | None, args: argparse.Namespace) -> str:
    lines: list[str] = []
    ours = step_values(this)
    width = max(len(name) for name, _ in STEPS) + 2
    if base is None:
        lines.append(f"  {'step':<{width}} {'process':<13} {'p50':>7} {'p25':>7} {'p75':>7}")
        for (name, where), values in zip(STEPS, ours, strict=True):
            p50, p25, p75 = quartiles(values)
            lines.append(f"  {name:<{width}} {where:<13} {p50:7.0f} {p25:7.0f} {p75:7.0f}")
        total = sum(quartiles(v)[0] for v in ours)
        lines.append(f"  {'sum of the medians':<{width}} {'':<13} {total:7.0f}")
        by_where: dict[str, float] = defaultdict(float)
        for (_, where), values in zip(STEPS, ours, strict=True):
            by_where[where] += quartiles(values)[0]
        lines.append(
            f"  {'  of which':<{width}} "
            + ", ".join(f"{w} {us:.0f}" for w, us in sorted(by_where.items()))
        )
        p50, p25, p75 = quartiles(_whole(this))
        whole = "whole run (trigger -> completion)"
        lines.append(f"  {whole:<{width}} {'':<13} {p50:7.0f} {p25:7.0f} {p75:7.0f}")
    else:
        theirs = step_values(base)
        lines.append(
            f"  {'step':<{width}} {'process':<13} {'this p50 (p25-p75)':>20}"
            f" {'base p50 (p25-p75)':>20} {'ratio':>6}"
        )

        def cell(values: list[float]) -> str:
            p50, p25, p75 = quartiles(values)
            return f"{p50:7.0f} ({p25:.0f}-{p75:.0f})"

        def ratio(a: list[float], b: list[float]) -> str:
            x, y = quartiles(a)[0], quartiles(b)[0]
            return f"{x / y:6.2f}" if y > 0 else f"{'-':>6}"

        rows = [*zip(STEPS, ours, theirs, strict=True)]
        for (name, where), a, b in rows:
            lines.append(f"  {name:<{width}} {where:<13} {cell(a):>20} {cell(b):>20} {ratio(a, b)}")
        sa = sum(quartiles(v)[0] for v in ours)
        sb = sum(quartiles(v)[0] for v in theirs)
        lines.append(
            f"  {'sum of the medians':<{width}} {'':<13} {sa:20.0f} {sb:20.0f} {sa / sb:6.2f}"
        )
        for where in (ORCHESTRATOR, WORKER, WIRE):
            xa = sum(quartiles(v)[0] for (_, w), v in zip(STEPS, ours, strict=True) if w == where)
            xb = sum(quartiles(v)[0] for (_, w), v in zip(STEPS, theirs, strict=True) if w == where)
            ratio_text = f"{xa / xb:6.2f}" if xb > 0 else f"{'-':>6}"
            lines.append(f"  {'  ' + where:<{width}} {'':<13} {xa:20.0f} {xb:20.0f} {ratio_text}")
        wa, wb = _whole(this), _whole(base)
        lines.append(
            f"  {'whole run (trigger -> completion)':<{width}} {'':<13}"
            f" {cell(wa):>20} {cell(wb):>20} {ratio(wa, wb)}"
        )
    for name, rounds in (("this", this), ("base", base or [])):
        if rounds:
            lines.append(f"runs matched ({name}, per round): {_runs_line(rounds, args.runs)}")
            lines.append(
                f"interlock_bench.py ({name}): " + "; ".join(r.driver_line for r in rounds)
            )
    for name, rounds in (("this", this), ("base", base or [])):
        lines += _calls(rounds, name if base else "")
        lines += _unwrapped(rounds, name)
    return "\n".join(lines)


def _unwrapped(rounds: list[Round], name: str) -> list[str]:
    """The functions of ``--wrap`` that no process wrapped, and why."""
    wrapped: set[str] = set()
    missing: dict[str, set[str]] = defaultdict(set)  # spec -> roles without that name
    for note in {n for r in rounds for n in r.notes}:
        role, _, text = note.partition(": ")
        if text.startswith("wrapped: "):
            wrapped.add(text.removeprefix("wrapped: "))
        elif text.startswith("not wrapped: "):
            spec, _, reason = text.removeprefix("not wrapped: ").partition(" ")
            missing[spec] |= {role} if reason == "(no such name)" else set()
    return [
        f"not wrapped ({name}): {spec}: "
        + (f"no such name in {', '.join(sorted(roles))}" if roles else "no process imported it")
        for spec, roles in sorted(missing.items())
        if spec not in wrapped
    ]


def _calls(rounds: list[Round], name: str) -> list[str]:
    """The wrapped functions: calls per counted run, and the microseconds of one call."""
    keys = sorted({k for r in rounds for k in r.calls})
    runs = sum(r.matched.triggers for r in rounds)
    if not keys or not runs:
        return []
    out = [f"wrapped functions{' (' + name + ')' if name else ''}: calls per run, us per call"]
    for role, fn in keys:
        spans = [(b - a) / 1000 for r in rounds for a, b in r.calls.get((role, fn), [])]
        p50, p25, p75 = quartiles(spans)
        out.append(
            f"  {role:<12} {fn:<48} {len(spans) / runs:6.2f} calls"
            f"  p50 {p50:7.1f}  p25 {p25:7.1f}  p75 {p75:7.1f}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench steps", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=500, help="counted runs one after another, a round")
    p.add_argument("--warmup", type=int, default=50, help="runs before them, not counted")
    p.add_argument(
        "--rounds", type=int, default=None, help="rounds of each (default 1; 2 with a baseline)"
    )
    p.add_argument("--baseline-venv", type=Path, help="another checkout's venv, rounds alternating")
    p.add_argument("--wrap", default="", help="module:Class.function,... also timed per call")
    p.add_argument("--fsync", choices=("default", "always"), default="default")
    args = p.parse_args(argv)
    rounds = args.rounds or (2 if args.baseline_venv else 1)
    started = time.time()
    this: list[Round] = []
    base: list[Round] = []
    loads = []
    for i in range(1, rounds + 1):
        loads.append(os.getloadavg()[0])
        this.append(run_round(Path(sys.executable), f"steps{i}", args, base=False))
        if args.baseline_venv is not None:
            loads.append(os.getloadavg()[0])
            python = args.baseline_venv / "bin" / "python"
            base.append(run_round(python, f"steps-base{i}", args, base=True))
    print(
        f"one run's steps, microseconds: median, 25th and 75th percentile over {rounds} round(s)"
        f" of {args.runs} runs one after another (after {args.warmup} warm-up runs),"
        f" sync_interval {args.fsync}; load average {min(loads):.1f} to {max(loads):.1f};"
        f" {time.time() - started:.0f} s"
    )
    print(report(this, base if args.baseline_venv is not None else None, args))
    return 0 if all(r.matched.runs for r in this + base) else 1
