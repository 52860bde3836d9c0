"""A run's page as an operator reads it: a warning when no worker serves what it waits for,
where its state timeout goes, a map's items as a table with a waterfall, long outputs
collapsed below the diagram, and on a phone the diagram opened at the current state."""

from __future__ import annotations

import asyncio

import pytest
from console_stack import CONTRAST, UNLABELLED, Console, console, shot, sign_in

from support.concurrency import ONE_AT_A_TIME, SHARED_FAIRLY
from support.gateway import wait_status, yaml

__all__ = ["console"]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]


async def test_a_run_waiting_for_an_unserved_capability_says_so(console: Console) -> None:
    page = await console.page(token=None)
    await page.goto(f"{console.url}#/runs/{console.runs['unserved']}")
    await sign_in(page, console.gs.tokens["reader"])
    warning = page.locator("#unserved")
    await warning.wait_for()
    assert (await warning.inner_text()).startswith("No live worker serves nobody")
    timers = page.get_by_role("table", name="Timers")
    row = timers.locator("tr", has_text="state-timeout")
    assert "goes to gave-up" in await row.inner_text()
    # A run whose capability has a worker: no warning.
    await page.goto(f"{console.url}#/runs/{console.runs['hook']}")
    # The unserved run's page has a table of that name too: wait for the hook run's own.
    events = page.get_by_role("table", name="Events that move it")
    await events.filter(has_text="deploy.finished").wait_for()
    assert await page.locator("#unserved").count() == 0
    assert page.errors == []


async def test_a_maps_items_are_a_table_with_a_waterfall(console: Console) -> None:
    for width, height in ((1280, 800), (390, 844)):
        page = await console.page(width, height)
        await page.goto(f"{console.url}#/runs/{console.runs['mapped']}")
        items = page.locator("table.map-items")
        await items.wait_for()
        rows = items.locator("tbody tr")
        assert await rows.count() == 6
        cells = await rows.evaluate_all(
            "rs => rs.map(r => [...r.cells].slice(0, 7).map(c => c.textContent))"
        )
        assert sorted(int(c[0]) for c in cells) == [0, 1, 2, 3, 4, 5]
        assert {c[1] for c in cells} == {"1"}
        assert {c[2] for c in cells} == {"echo"}
        assert all(c[3] and c[3] != "—" for c in cells), cells
        assert {c[6] for c in cells} == {"completed"}
        assert await items.locator(".bar-good").count() == 6
        # The map's record says its join, left out of the record as the default.
        started = page.locator(".rec-map-started")
        assert "join all" in await started.inner_text()
        assert "undefined" not in await page.locator("main").inner_text()
        # The outputs (six results, over a dozen lines) are collapsed, below the diagram.
        outputs = page.locator("details.outputs")
        assert await outputs.get_attribute("open") is None
        order = await page.evaluate(
            "() => [...document.querySelectorAll('main h2')].map(e => e.textContent)"
        )
        assert order.index("Diagram") < order.index("Outputs") < order.index("Timeline"), order
        await outputs.locator("summary").click()
        assert '"results"' in await outputs.locator("pre").inner_text()
        assert await page.evaluate(UNLABELLED) == []
        got = await page.evaluate(CONTRAST)
        assert got["failures"] == [], got["failures"]
        if width < 1280:
            assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        await shot(page, f"run-map-{width}", docs=width == 1280)
        assert page.errors == []


async def test_on_a_phone_the_diagram_opens_at_the_current_state(console: Console) -> None:
    async with console.gs.http() as http:
        r = await http.post("/runs", json={"workflow": "stages", "inputs": {}})
        run_id = r.json()["run_id"]
        await wait_status(console.gs, run_id, "running", "s01")
        for _ in range(15):
            r = await http.post(f"/runs/{run_id}/signals/step.done", params={"wait": 20})
            assert r.json()["outcome"] == "moved", r.text
    page = await console.page(390, 844)
    await page.goto(f"{console.url}#/runs/{run_id}")
    node = page.locator("svg .node.current")
    await node.wait_for()
    assert await node.get_attribute("data-state") == "s16"
    box = page.locator(".diagram-box").first
    await page.wait_for_function(
        """() => {
          const box = document.querySelector('.diagram-box').getBoundingClientRect();
          const at = document.querySelector('svg .node.current').getBoundingClientRect();
          return at.top >= box.top && at.bottom <= box.bottom
            && at.left >= box.left && at.right <= box.right;
        }"""
    )
    assert await box.evaluate("b => b.scrollTop") > 0
    await shot(page, "run-phone-current")
    assert page.errors == []


async def test_a_log_with_a_foreign_message_warns_and_shows_the_rest(console: Console) -> None:
    """A message in the run's log that Interlock did not write (no record MAC): the page
    says where it is and shows the run as its records say."""
    async with console.gs.http() as http:
        r = await http.post("/runs", json={"workflow": "stages", "inputs": {}})
        run_id = r.json()["run_id"]
    await wait_status(console.gs, run_id, "running", "s01")
    stack = console.gs.stack
    await stack.js.publish(stack.subjects.run(run_id), b'{"stream": "X", "seq": 1}')
    page = await console.page(token=None)
    await page.goto(f"{console.url}#/runs/{run_id}")
    await sign_in(page, console.gs.tokens["reader"])
    warning = page.locator(".log-warnings .warning")
    await warning.wait_for()
    assert await warning.count() == 1
    text = await warning.inner_text()
    assert "is not a record Interlock wrote (it carries no record MAC): skipped" in text
    assert stack.subjects.run(run_id) in text
    assert await page.locator("svg .node.current").get_attribute("data-state") == "s01"
    assert page.errors == []


async def test_a_run_queued_for_a_slot_shows_its_place_in_line(console: Console) -> None:
    gs = console.gs
    await gs.stack.apply(ONE_AT_A_TIME)
    async with gs.http() as http:
        first = (await http.post("/runs", json={"workflow": "one-at-a-time"})).json()["run_id"]
        await wait_status(gs, first, "running", "waiting")
        second = (await http.post("/runs", json={"workflow": "one-at-a-time"})).json()["run_id"]
    page = await console.page()
    await page.goto(f"{console.url}#/runs/{second}")
    await page.locator("#queued").wait_for()
    slots = page.get_by_role("table", name="Concurrency slots")
    row = await slots.locator("tbody tr").inner_text()
    assert "one-at-a-time" in row
    assert "waits, next in line" in row
    # Its timeline says what it waits for; its header shows only what is there.
    waits = page.get_by_text("queued: waits for a slot of default/one-at-a-time#1 for key all")
    await waits.wait_for()
    assert "null" not in await page.locator(".title-row").inner_text()
    assert await page.evaluate(UNLABELLED) == []
    await page.goto(f"{console.url}#/runs/{first}")
    await page.get_by_role("heading", name=f"Run {first}").wait_for()
    slots = page.get_by_role("table", name="Concurrency slots")
    await slots.locator("tbody tr", has_text="holds one").wait_for()
    assert await page.locator("#queued").count() == 0
    await page.get_by_text("admitted: holds a slot of default/one-at-a-time#1").wait_for()
    assert page.errors == []


async def test_a_place_under_fair_share_is_among_the_runs_of_its_fairness_key(
    console: Console,
) -> None:
    gs = console.gs
    await gs.stack.apply(SHARED_FAIRLY)
    async with gs.http() as http:

        async def start(customer: str) -> str:
            body = {"workflow": "shared-fairly", "inputs": {"customer": customer}}
            return str((await http.post("/runs", json=body)).json()["run_id"])

        await wait_status(gs, await start("acme"), "running", "waiting")
        for customer in ("beta", "acme"):
            await start(customer)
        last = await start("acme")
        # Third in the line, second among acme's runs (beta's goes next).
        for _ in range(300):
            slot = (await http.get(f"/runs/{last}")).json()["slots"][0]
            if slot.get("place") is not None:
                break
            await asyncio.sleep(0.1)
        assert (slot["fair"], slot["place"]) == ("acme", 2), slot
    page = await console.page()
    await page.goto(f"{console.url}#/runs/{last}")
    await page.locator("#queued").wait_for()
    slots = page.get_by_role("table", name="Concurrency slots")
    row = await slots.locator("tbody tr").inner_text()
    assert "waits, place 2 in line among acme's runs" in row, row
    assert page.errors == []


CHAINED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: chained}
spec:
  initial_state: waiting
  states:
    waiting:
      type: human_in_the_loop
      on:
        - {event: renew, goto: waiting, continue_as_new: true}
        - {event: finish, goto: done}
    done: {type: terminal, outputs: {done: true}}
"""


async def test_a_chain_of_runs_continued_as_new_is_linked_both_ways(console: Console) -> None:
    """A run that continued three times: each page links the run before and the run
    after; the first run's result over HTTP follows the chain to the last."""
    gs = console.gs
    await gs.stack.apply(CHAINED)
    chain: list[str] = []
    async with gs.http() as http:
        r = await http.post("/runs", json={"workflow": "chained", "inputs": {}})
        chain.append(r.json()["run_id"])
        await wait_status(gs, chain[0], "running", "waiting")
        for _ in range(3):
            # Addressed to the first run: each signal goes on to the newest.
            r = await http.post(f"/runs/{chain[0]}/signals/renew", params={"wait": 20})
            told = r.json()
            assert told["outcome"] == "moved", r.text
            assert told["run_id"] == chain[-1]
            chain.append(told["continued_to"])
            await wait_status(gs, chain[-1], "running", "waiting")
        r = await http.post(f"/runs/{chain[0]}/signals/finish", params={"wait": 20})
        assert r.json()["run_id"] == chain[-1]
        result = (await http.get(f"/runs/{chain[0]}/result", params={"timeout": 20})).json()
        assert (result["status"], result["run_id"], result["chain"]) == (
            "completed",
            chain[-1],
            chain,
        )
        # The workflow's runs per version count the runs that continued.
        want = {"version": 1, "running": 0, "completed": 1, "failed": 0, "cancelled": 0}
        want["continued"] = 3
        for _ in range(600):
            runs = (await http.get("/workflows/chained")).json()["runs"]
            if runs == [want]:
                break
            await asyncio.sleep(0.05)
        assert runs == [want]

    page = await console.page(token=None)
    await page.goto(f"{console.url}#/runs/{chain[0]}")
    await sign_in(page, gs.tokens["reader"])
    for i, run_id in enumerate(chain):
        header = page.locator("h1")
        await header.filter(has_text=run_id).wait_for()
        if i == 0:
            assert await page.locator("#chain-previous").count() == 0
        else:
            previous = page.locator("#chain-previous")
            await previous.wait_for()
            assert await previous.inner_text() == chain[i - 1]
        if i + 1 < len(chain):
            nxt = page.locator("#chain-next")
            await nxt.wait_for()
            assert await nxt.inner_text() == chain[i + 1]
            assert "continued" in await page.locator(".title-row .status").inner_text()
            await nxt.click()
        else:
            assert await page.locator("#chain-next").count() == 0
            await page.locator(".title-row .status", has_text="completed").wait_for()
    # And back, from the last run to the first.
    for run_id in reversed(chain[:-1]):
        await page.locator("#chain-previous").click()
        await page.locator("h1").filter(has_text=run_id).wait_for()
    await page.locator("#chain-next").wait_for()
    # The timeline is drawn after the header: wait for the record (a wait that times
    # out fails the test as the assertion did).
    await page.locator(".rec-run-continued", has_text="(transition)").wait_for()
    await shot(page, "run-chain")
    assert page.errors == []


async def test_a_long_running_runs_page_reads_its_newest_page_and_follows_it_live(
    console: Console,
) -> None:
    """A running run of more records than a page: its page reads the newest page only, a
    record appended while it is open joins the end of the timeline, and "Earlier records"
    still reads the page before."""
    cycle = ("step.done", "step.done", "step.redo")  # s01 -> s02 -> s03 -> s01
    async with console.gs.http() as http:
        r = await http.post("/runs", json={"workflow": "stages", "inputs": {}})
        run_id = r.json()["run_id"]
        await wait_status(console.gs, run_id, "running", "s01")
        while (await http.get(f"/runs/{run_id}")).json()["records"] <= 210:
            for event in cycle:
                r = await http.post(f"/runs/{run_id}/signals/{event}", params={"wait": 20})
                assert r.json()["outcome"] == "moved", r.text
        total = (await http.get(f"/runs/{run_id}")).json()["records"]
    page = await console.page(token=None)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/log?" in r.url else None)
    await page.goto(f"{console.url}#/runs/{run_id}")
    await sign_in(page, console.gs.tokens["reader"])
    records = page.locator(".timeline .rec")
    await page.locator(f"#rec-{total}").wait_for(state="attached")
    await page.locator("#pause-run").wait_for()  # following the stream from here on

    async def shown() -> list[int]:
        ids = await records.evaluate_all("rows => rows.map(r => r.id)")
        return [int(i.removeprefix("rec-")) for i in ids]

    assert await shown() == list(range(total - 199, total + 1))
    async with console.gs.http() as http:
        r = await http.post(f"/runs/{run_id}/signals/step.done", params={"wait": 20})
        assert r.json()["outcome"] == "moved", r.text
        now = (await http.get(f"/runs/{run_id}")).json()["records"]
    assert now > total
    await page.locator(f"#rec-{now}").wait_for(state="attached")
    assert await shown() == list(range(total - 199, now + 1))
    node = page.locator("svg .node.current[data-state='s02']")
    await node.wait_for()
    assert len(asked) == 1, asked

    await page.locator("#timeline-earlier").click()
    await page.locator("#rec-1").wait_for(state="attached")
    assert await shown() == list(range(1, now + 1))
    assert await page.locator("#timeline-earlier").is_hidden()
    assert len(asked) == 2, asked
    assert page.errors == []


RATE_LIMITED = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: rate-limited
spec:
  initial_state: ask
  states:
    ask:
      actions:
        - capability: echo
          input: {retry_after: 600}
          retry: {max_attempts: 2, backoff: {initial: 1s, jitter: false}}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
"""


async def test_a_retry_held_back_by_the_agent_says_why_it_waits(console: Console) -> None:
    gs = console.gs
    await gs.stack.apply(RATE_LIMITED)
    async with gs.http() as http:
        r = await http.post("/runs", json={"workflow": "rate-limited"})
        run_id = r.json()["run_id"]
    page = await console.page()
    await page.goto(f"{console.url}#/runs/{run_id}")
    why = "the later of the backoff 1s and the agent's retry-after 600s"
    await page.get_by_text(why).wait_for()
    timers = page.get_by_role("table", name="Timers")
    await timers.locator("tr", has_text="asks again").wait_for()
    assert page.errors == []


HELD_CALL = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: AgentDef
    metadata:
      name: heldagent
    spec:
      capabilities:
        - name: held.call
          concurrency: {limit: 1, key: input.account}
    ---
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: held-call
    spec:
      initial_state: work
      states:
        work:
          actions:
            - capability: held.call
              input: {account: acme}
          on: [{event: task.completed, goto: done}]
        done: {type: terminal}
    """
)


async def test_a_cancel_says_its_call_keeps_its_slot_until_its_worker_stops(
    console: Console,
) -> None:
    """A run cancelled while its call of a limited capability is at work: its timeline
    says the slot stays held until the worker stops, and until when at the latest."""
    gs = console.gs
    await gs.stack.apply(HELD_CALL)
    async with gs.http() as http:
        run_id = (await http.post("/runs", json={"workflow": "held-call"})).json()["run_id"]
        for _ in range(300):  # until its request is admitted (dispatched: no worker serves it)
            log = (await http.get(f"/runs/{run_id}/log")).json()["records"]
            if any(r["type"].endswith("action.admitted") for r in log):
                break
            await asyncio.sleep(0.05)
        cancelled = await http.post(f"/runs/{run_id}/cancel", json={"reason": "not wanted"})
        assert cancelled.status_code == 200, cancelled.text
    await wait_status(gs, run_id, "cancelled")
    page = await console.page()
    await page.goto(f"{console.url}#/runs/{run_id}")
    said = page.locator(".rec-run-cancelled .stopping")
    await said.wait_for()
    text = await said.inner_text()
    assert "the slot of cap:held.call for key acme" in text, text
    assert "stays held until its worker stops" in text, text
    assert text.endswith("at the latest"), text
    assert page.errors == []
