"""Acting from the console as an operator does it, signed in through the form: a signal
that shows its guards and says why it was declined (bad JSON keeps the dialog), a fork at
a record and a migration (each previewed, then confirmed), a run started from a form of
the workflow's inputs, dead letters filtered, linked to their runs and discarded; and the
agents page, compact, each worker process once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from console_stack import CONTRAST, UNLABELLED, Console, console, shot, sign_in

from interlock.sdk import TaskContext, Worker
from support.gateway import wait_status, yaml
from support.runtime import connect

__all__ = ["console"]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

GUARDED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: guarded
    spec:
      inputs:
        size: {type: integer, required: true}
        label: {type: string, default: none}
        tags: {type: "list[string]"}
      initial_state: approval
      states:
        approval:
          type: human_in_the_loop
          on:
            - {event: approval.granted, guard: "data.score > 7", goto: done}
            - {event: approval.denied, goto: rejected}
        done:
          type: terminal
        rejected:
          type: terminal
          fail: {message: "rejected by a person"}
    """
)


async def signed_in(console: Console, where: str, width: int = 1280, height: int = 800) -> Any:
    page = await console.page(width, height, token=None)
    await page.goto(f"{console.url}{where}")
    await sign_in(page, console.gs.tokens["operator"])
    return page


async def checked(page: Any, what: str) -> None:
    """Every control labelled, every text readable, on what is shown now."""
    assert await page.evaluate(UNLABELLED) == [], what
    got = await page.evaluate(CONTRAST)
    assert got["failures"] == [], (what, got["failures"])


async def test_a_signal_shows_its_guard_keeps_bad_json_and_says_why_it_was_declined(
    console: Console,
) -> None:
    gs = console.gs
    await gs.stack.apply(GUARDED)
    async with gs.http() as http:
        r = await http.post("/runs", json={"workflow": "guarded", "inputs": {"size": 1}})
        run_id = r.json()["run_id"]
    await wait_status(gs, run_id, "running", "approval")
    page = await signed_in(console, f"#/runs/{run_id}")
    await page.get_by_role("button", name="Send signal…").click()
    dialog = page.get_by_role("dialog")
    assert await dialog.get_by_label("Event type").input_value() == "approval.granted"
    guard = dialog.locator("#sig-guard")
    assert "goes to done if data.score > 7 is true" in await guard.inner_text()
    await dialog.get_by_label("Data (JSON, optional)").fill('{"score": 3')
    await dialog.get_by_role("button", name="Send", exact=True).click()
    await dialog.get_by_role("alert").filter(has_text="The data is not JSON").wait_for()
    assert await dialog.is_visible()
    assert await dialog.get_by_label("Data (JSON, optional)").input_value() == '{"score": 3'
    await checked(page, "signal dialog")
    await dialog.get_by_label("Data (JSON, optional)").fill('{"score": 3}')
    await dialog.get_by_role("button", name="Send", exact=True).click()
    await dialog.wait_for(state="detached")
    outcome = page.locator("#signal-outcome")
    await outcome.get_by_text("Signal approval.granted: declined").wait_for()
    # Which guard was false: as the signal's answer says it (each transition and why).
    why = await outcome.locator("li").all_inner_texts()
    assert len(why) == 1, why
    assert "data.score > 7" in why[0]
    assert "false" in why[0]
    await shot(page, "signal-declined")

    # A signal whose decision ends the run says so.
    await page.get_by_role("button", name="Send signal…").click()
    await dialog.get_by_label("Event type").fill("approval.denied")
    assert "goes to rejected (no guard)" in await dialog.locator("#sig-guard").inner_text()
    await dialog.get_by_role("button", name="Send", exact=True).click()
    said = "Signal approval.denied: moved to rejected and failed: workflow_failed: rejected by a"
    await outcome.get_by_text(f"{said} person").wait_for()
    await page.locator("h1 + .status", has_text="failed").wait_for()
    assert page.errors == []


async def test_a_run_is_forked_at_a_record_after_a_preview(console: Console) -> None:
    origin = console.runs["to-keyboard"]
    page = await signed_in(console, f"#/runs/{origin}")
    await page.get_by_role("button", name="Fork…").click()
    dialog = page.get_by_role("dialog")
    confirm = dialog.get_by_role("button", name="Fork", exact=True)
    assert await confirm.is_disabled()
    records = int(await dialog.get_by_label("At record").input_value())
    assert records > 3
    await dialog.get_by_role("button", name="Preview").click()
    preview = dialog.locator("#fork-preview")
    await preview.get_by_text("goes on in state").wait_for()
    assert f"copies records 1\u2013{records}" in await preview.inner_text()
    assert "approval" in await preview.inner_text()
    await checked(page, "fork preview")
    await shot(page, "fork-preview", docs=True)
    # A preview on another version replays the run against it.
    await dialog.get_by_label("On version").select_option("2")
    assert await confirm.is_disabled()
    await dialog.get_by_role("button", name="Preview").click()
    await preview.get_by_text("Replayed against v2").wait_for()
    await confirm.click()
    await dialog.wait_for(state="detached")
    await page.wait_for_function(
        f"location.hash.startsWith('#/runs/') && !location.hash.endsWith('{origin}')"
    )
    forked = page.url.rsplit("/", 1)[1]
    await page.get_by_role("heading", name=f"Run {forked}").wait_for()
    await page.locator(".rec-run-forked", has_text=origin).wait_for()
    await page.locator("#forked-from", has_text=f"{origin} at #").wait_for()
    await wait_status(console.gs, forked, "running", "approval")
    async with console.gs.http() as http:
        assert (await http.get(f"/runs/{forked}")).json()["version"] == 2
    assert page.errors == []


async def test_a_workflows_running_runs_migrate_after_a_preview(console: Console) -> None:
    page = await signed_in(console, "#/workflows/default/review")
    await page.get_by_role("heading", name="Workflow review").wait_for()
    counts = page.get_by_role("table", name="Runs per version")
    assert "v1" in await counts.inner_text()
    await page.get_by_role("button", name="Migrate running runs…").click()
    dialog = page.get_by_role("dialog")
    assert await dialog.get_by_role("button", name="Migrate", exact=True).is_disabled()
    await dialog.get_by_role("button", name="Preview").click()
    preview = dialog.locator("#migrate-preview")
    await preview.get_by_text("would move to v2").wait_for()
    await checked(page, "migrate preview")
    moving = await preview.locator("a").all_inner_texts()
    assert console.runs["waiting"] in moving
    async with console.gs.http() as http:
        assert (await http.get(f"/runs/{console.runs['waiting']}")).json()["version"] == 1
        await dialog.get_by_role("button", name="Migrate", exact=True).click()
        await dialog.wait_for(state="detached")
        await page.get_by_role("status").filter(has_text="moved to v2").wait_for()
        assert (await http.get(f"/runs/{console.runs['waiting']}")).json()["version"] == 2
    assert page.errors == []


async def test_a_run_is_started_from_a_form_of_its_inputs(console: Console) -> None:
    await console.gs.stack.apply(GUARDED)
    # From the list of workflows: the form, with the workflow's inputs.
    page = await signed_in(console, "#/workflows")
    await page.get_by_role("button", name="Start a run of default/hello").click()
    listed = page.get_by_role("dialog")
    await listed.get_by_label("message").wait_for()
    await checked(page, "start dialog from the list")
    await listed.get_by_role("button", name="Back").click()
    await listed.wait_for(state="detached")
    page = await signed_in(console, "#/workflows/default/guarded", 390, 844)
    source = page.get_by_label("Manifest of v1 as applied")
    assert 'guard: "data.score > 7"' in await source.inner_text()
    await page.get_by_role("button", name="Start a run…").click()
    dialog = page.get_by_role("dialog")
    size = dialog.get_by_label("size")
    assert await size.get_attribute("type") == "number"
    assert await size.get_attribute("required") is not None
    assert await dialog.get_by_label("label").get_attribute("required") is None
    await checked(page, "start dialog")
    await size.fill("2.5")
    await dialog.get_by_label("tags").fill('["a", "b"]')
    await dialog.get_by_role("button", name="Start", exact=True).click()
    await dialog.get_by_role("alert").filter(has_text="size must be a whole number").wait_for()
    await dialog.get_by_label("tags").fill('["a", ')
    await size.fill("4")
    await dialog.get_by_role("button", name="Start", exact=True).click()
    await dialog.get_by_role("alert").filter(has_text="tags is not JSON").wait_for()
    await dialog.get_by_label("tags").fill('["a", "b"]')
    await dialog.get_by_role("button", name="Start", exact=True).click()
    await dialog.wait_for(state="detached")
    await page.wait_for_function("location.hash.startsWith('#/runs/')")
    run_id = page.url.rsplit("/", 1)[1]
    await page.get_by_role("heading", name=f"Run {run_id}").wait_for()
    async with console.gs.http() as http:
        inputs = (await http.get(f"/runs/{run_id}")).json()["inputs"]
    assert inputs == {"size": 4, "tags": ["a", "b"], "label": "none"}
    assert page.errors == []


async def test_dead_letters_are_filtered_linked_to_runs_and_discarded(console: Console) -> None:
    gs = console.gs
    run_id = console.runs["completed"]
    subject = gs.stack.subjects.event("com.example.discard")
    await gs.stack.js.publish(subject, b"{not json", headers={"ce-runid": run_id})
    for _ in range(2):
        await gs.stack.js.publish(gs.stack.subjects.event("com.example.more"), b"{nor this")
    async with gs.http() as http:
        for _ in range(300):
            letters = (await http.get("/dead-letters")).json()
            if sum(d["reason"] == "bad-json" for d in letters) >= 3:
                break
            await asyncio.sleep(0.1)
    page = await signed_in(console, "#/dead-letters")
    await page.get_by_role("heading", name="Dead letters").wait_for()
    await page.get_by_label("Reason").select_option("bad-json")
    await page.wait_for_function("location.hash.includes('reason=bad-json')")
    # The address changes at once; the page's listing, once the letters are read again.
    await page.wait_for_function(
        """() => {
          const cells = [...document.querySelectorAll("main tbody td[data-label='Reason']")];
          return cells.length && cells.every(e => e.textContent === 'bad-json');
        }"""
    )
    reasons = await page.locator("main tbody td[data-label='Reason']").all_inner_texts()
    assert set(reasons) == {"bad-json"}
    await checked(page, "dead letters")
    await shot(page, "dead-letters", docs=True)
    link = page.locator("main tbody td[data-label='Run'] a", has_text=run_id).first
    await link.click()
    await page.get_by_role("heading", name=f"Run {run_id}").wait_for()

    # A reader's discard is refused by the API's own 403, shown in the dialog.
    reader = await console.page(token=console.gs.tokens["reader"])
    await reader.goto(f"{console.url}#/dead-letters")
    await reader.get_by_role("button", name="Discard…").click()
    await reader.get_by_role("dialog").get_by_label("Reason").select_option("bad-json")
    await reader.get_by_role("dialog").get_by_role("button", name="Discard").click()
    refused = reader.get_by_role("dialog").get_by_role("alert")
    await refused.filter(has_text="may not discard dead letters").wait_for()
    assert reader.errors == []

    # One, from its page.
    await page.goto(f"{console.url}#/dead-letters?reason=bad-json")
    first = page.locator("main tbody a").first
    name = await first.inner_text()
    await first.click()
    await page.get_by_role("heading", name=f"Dead letter {name}").wait_for()
    await page.get_by_role("button", name="Discard…").click()
    await page.get_by_role("dialog").get_by_role("button", name="Discard").click()
    await page.get_by_role("heading", name="Dead letters").wait_for()
    async with gs.http() as http:
        assert (await http.get(f"/dead-letters/{name.lstrip('#')}")).status_code == 404

    # By reason, and older than an age (none is an hour old).
    await page.get_by_role("button", name="Discard…").click()
    dialog = page.get_by_role("dialog")
    await dialog.get_by_role("button", name="Discard").click()
    await dialog.get_by_role("alert").filter(has_text="Choose a reason or an age").wait_for()
    await dialog.get_by_label("Reason").select_option("bad-json")
    await dialog.get_by_label("Kept longer than").fill("1h")
    await dialog.get_by_role("button", name="Discard").click()
    await page.get_by_role("status").filter(has_text="Discarded 0 dead letters").wait_for()
    await page.get_by_role("button", name="Discard…").click()
    await dialog.get_by_label("Reason").select_option("bad-json")
    await dialog.get_by_role("button", name="Discard").click()
    await page.get_by_role("status").filter(has_text="Discarded 2 dead letters").wait_for()
    async with gs.http() as http:
        left = (await http.get("/dead-letters", params={"reason": "bad-json"})).json()
    assert left == []
    assert page.errors == []


async def test_the_agents_page_is_compact_and_lists_each_worker_once(console: Console) -> None:
    gs = console.gs
    await gs.stack.apply(
        "apiVersion: interlock.io/v1\nkind: AgentDef\nmetadata: {name: helper}\n"
        "spec:\n  capabilities:\n    - {name: assist}\n"
    )
    worker = Worker(f"twofold-{uuid.uuid4().hex[:6]}", concurrency=2, grace_period=1.0)

    @worker.capability("echo")
    async def echo(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return inp

    @worker.capability("assist")
    async def assist(inp: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
        return inp

    where = gs.stack.client.nc.connected_url
    nc = await connect(f"nats://{where.hostname}:{where.port}")
    task = asyncio.create_task(worker.run(nc, prefix=gs.stack.subjects.prefix))
    try:
        await asyncio.wait_for(worker.wait_ready(), 30)
        for width, height in ((1280, 800), (390, 844)):
            page = await signed_in(console, "#/agents", width, height)
            workers = page.get_by_role("table", name="Live workers")
            mine = workers.locator("tbody tr", has_text=worker.name)
            for _ in range(100):
                # The page draws its tables once its reads are answered, after the reload
                # returns: count the rows of the table drawn, not of a page still reading.
                await workers.wait_for()
                if await mine.count():
                    break
                await asyncio.sleep(0.1)
                await page.reload()
            assert await mine.count() == 1
            agentdefs = await mine.locator("td[data-label='AgentDefs']").inner_text()
            assert agentdefs == "helper, testagent"
            caps = page.get_by_role("table", name="Capabilities")
            liar = caps.locator("tr", has=page.locator("code", has_text="liar"))
            assert "1 failed attempt" in await liar.inner_text()
            height_px = await page.evaluate("document.documentElement.scrollHeight")
            if width == 1280:
                assert height_px < 1300, height_px
                await shot(page, "agents", docs=True)
            else:
                assert await page.evaluate("document.documentElement.scrollWidth") <= 390
            await checked(page, f"agents {width}")
            assert page.errors == []
    finally:
        await worker.stop()
        task.cancel()
        await nc.close()


PAUSABLE = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: pausable
    spec:
      initial_state: approval
      states:
        approval:
          type: human_in_the_loop
          on:
            - {event: approval.granted, goto: done}
        done:
          type: terminal
    """
)


async def test_runs_and_workflows_are_paused_and_resumed_from_the_console(
    console: Console,
) -> None:
    gs = console.gs
    await gs.stack.apply(PAUSABLE)
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "pausable"})).json()["run_id"]
    await wait_status(gs, run_id, "running", "approval")
    page = await signed_in(console, f"#/runs/{run_id}")
    await page.get_by_label("Why pause run").fill("waiting for the vendor")
    await page.locator("#pause-run").click()
    said = page.locator("#run-paused")
    await said.wait_for()
    await page.locator(".title-row .status-paused").wait_for()
    async with gs.http() as http:
        pause = (await http.get(f"/runs/{run_id}")).json()["paused"]
    assert pause["reason"] == "waiting for the vendor"
    assert f"Paused since {pause['at']}: waiting for the vendor." in await said.inner_text()
    await page.goto(f"{console.url}#/runs?workflow=pausable")
    await page.locator("tr", has_text=run_id).locator(".status-paused").wait_for()
    await page.goto(f"{console.url}#/runs/{run_id}")
    await page.get_by_role("button", name="Resume run").click()
    await page.locator("#run-paused").wait_for(state="detached")
    async with gs.http() as http:
        assert (await http.get(f"/runs/{run_id}")).json()["paused"] is None

    # The workflow: paused from its page, its new run held, resumed from the queues page.
    await page.goto(f"{console.url}#/workflows/default/pausable")
    await page.get_by_label("Why pause workflow").fill("release freeze")
    await page.locator("#pause-workflow").click()
    await page.locator("#workflow-paused", has_text=": release freeze.").wait_for()
    async with gs.http() as http:
        held = (await http.post("/runs", json={"workflow": "pausable"})).json()["run_id"]
    await page.get_by_role("link", name="Queues").click()
    line = page.locator("tr", has_text="default/pausable@paused")
    for _ in range(300):  # until the orchestrator has put the run in the workflow's line
        await page.locator("main h1", has_text="Queues").wait_for()  # drawn, not still reading
        if await line.count():
            break
        await asyncio.sleep(0.1)
        await page.reload()
    await line.locator(".status-paused").wait_for()
    # Since when and why, on the line of what it holds and in the paused workflows' table.
    await line.get_by_text(": release freeze").wait_for()
    await checked(page, "the queues page")
    await shot(page, "queues", docs=True)
    paused = page.locator("tr", has_text="default/pausable").filter(has_not_text="@paused")
    await paused.get_by_role("button", name="Resume workflow").click()
    await page.get_by_text("No workflow is paused.").wait_for()
    await wait_status(gs, held, "running", "approval")
    # Its timeline says it went on as its workflow was resumed, as explain says it.
    await page.goto(f"{console.url}#/runs/{held}")
    await page.get_by_text("admitted: default/pausable resumed").wait_for()
    assert await page.get_by_text("holds a slot of default/pausable@paused").count() == 0
    await page.get_by_role("link", name="Queues").click()
    await page.locator("main h1", has_text="Queues").wait_for()

    # A capability: paused from the form, listed paused, resumed from its line.
    await page.get_by_label("Capability", exact=True).select_option("slow")
    await page.get_by_label("Reason").fill("vendor 429s")
    await page.locator("#pause-cap-go").click()
    resume = page.get_by_role("button", name="Resume capability slow")
    await resume.wait_for()
    async with gs.http("reader") as http:
        lines = (await http.get("/queues", params={"capability": "slow"})).json()
        assert [(q["capability"], q["paused"]) for q in lines] == [("slow", True)]
        assert lines[0]["paused_reason"] == "vendor 429s"
    line = page.locator("tr", has_text="cap:slow@paused")
    await line.get_by_text(": vendor 429s").wait_for()
    since = line.locator("time").last  # the Paused cell (after Oldest wait)
    assert await since.get_attribute("datetime") == lines[0]["paused_since"]
    await resume.click()
    await page.get_by_role("button", name="Resume capability slow").wait_for(state="detached")
    assert page.errors == []


PACED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata: {name: paced}
    spec:
      triggers:
        - event: com.example.paced
          rate: {limit: 1, per: 1h}
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on: [{event: go, goto: done}]
        done: {type: terminal}
    """
)


async def test_the_queues_page_shows_runs_waiting_for_a_triggers_rate(console: Console) -> None:
    gs = console.gs
    await gs.stack.apply(PACED)
    async with gs.http("publisher") as http:
        for n in range(3):
            event = {
                "specversion": "1.0",
                "id": f"paced-{n}",
                "source": "/api",
                "type": "com.example.paced",
                "data": {},
            }
            posted = await http.post(
                "/events", json=event, headers={"Content-Type": "application/cloudevents+json"}
            )
            assert posted.status_code == 202, posted.text
    page = await signed_in(console, "#/queues")
    line = page.locator("tr", has_text="default/paced#trigger1@rate")
    for _ in range(300):  # until the orchestrator has given the two waiting runs their times
        await page.locator("main h1", has_text="Queues").wait_for()  # drawn, not still reading
        if await line.filter(has_text="(since").count():
            break
        await asyncio.sleep(0.1)
        await page.reload()
    # One run started, two wait their turn; how long the first has waited, since when.
    await line.get_by_text("1/1").wait_for()
    await line.locator("td", has_text="(since").wait_for()
    cells = await line.locator("td").all_inner_texts()
    assert cells[1:5] == ["rate", "—", "1/1", "2"], cells  # no key: one rate for the trigger
    assert page.errors == []


HELD = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: held-lines
    spec:
      inputs:
        customer: {type: string, required: true}
      concurrency:
        - {key: inputs.customer, limit: 1}
      initial_state: waiting
      states:
        waiting:
          type: human_in_the_loop
          on: [{event: go, goto: done}]
        done: {type: terminal}
    """
)


async def test_the_queues_page_goes_a_page_at_a_time(console: Console) -> None:
    """``#/queues?limit=1``: one line a page, **Next →** to the next (its line further on
    in limit then key order), **← First** back."""
    gs = console.gs
    await gs.stack.apply(HELD)
    for customer in ("p1", "p2"):
        await gs.stack.client.start("held-lines", {"customer": customer})
    async with gs.http("reader") as http:

        async def both_held() -> bool:
            lines = (await http.get("/queues", params={"workflow": "held-lines"})).json()
            return [q["key"] for q in lines] == ["p1", "p2"]

        for _ in range(300):
            if await both_held():
                break
            await asyncio.sleep(0.1)
        assert await both_held()
    page = await signed_in(console, "#/queues?limit=1")
    rows = page.locator("table tbody tr")
    await page.locator("#queues-next").wait_for()
    assert await rows.count() == 1
    first = (await rows.first.locator("td").all_inner_texts())[:3]
    assert await page.locator("#queues-first").is_disabled()
    await page.locator("#queues-next").click()
    await page.wait_for_function("location.hash.includes('after=')")
    await page.locator("#queues-first:not([disabled])").wait_for()
    assert await rows.count() == 1
    second = (await rows.first.locator("td").all_inner_texts())[:3]
    assert (second[0], second[2]) > (first[0], first[2]), (first, second)
    await checked(page, "a page of queues further on")
    await page.locator("#queues-first").click()
    await page.locator("#queues-first[disabled]").wait_for()
    assert "after=" not in await page.evaluate("location.hash")
    assert page.errors == []
