"""The web console in headless Chromium against a real stack: each page loaded, and what a
person would check on it (the diagram marks the right state, the timeline names the guard
that was false, cancel ends a run, a signal moves one, a dead letter redrives).

One stack and one browser for the module; each test opens its own page. Screenshots go to
``.artifacts/console/`` (and, with ``INTERLOCK_DOCS_SCREENSHOTS=1``, to docs/console/)."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta

import pytest
from console_stack import (
    CONTRAST,
    UNLABELLED,
    Console,
    confirmation_escaped,
    console,
    dead_letters_page,
    shot,
    sign_in,
    tab_until,
)

from support.gateway import wait_status

__all__ = ["console"]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]


async def test_runs_page_lists_runs_of_every_status_and_filters(console: Console) -> None:
    page = await console.page()
    await page.goto(console.url)
    table = page.locator("#runs-listing table")
    await table.wait_for()
    for run_id in console.runs.values():
        await page.get_by_role("link", name=run_id).first.wait_for()
    statuses = await table.locator(".status").all_inner_texts()
    assert {"running", "completed", "failed", "cancelled"} <= set(statuses)
    await shot(page, "runs", docs=True)

    await page.get_by_label("Status").select_option("failed")
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#runs-listing .status')]"
        ".every(e => e.textContent === 'failed')"
    )
    assert await page.get_by_role("link", name=console.runs["failed"]).count() == 1
    assert "status=failed" in page.url

    await page.get_by_label("Run id").fill(console.runs["completed"])
    await page.get_by_role("button", name="Open run").click()
    await page.get_by_role("heading", name=f"Run {console.runs['completed']}").wait_for()
    assert page.errors == []


async def test_a_waiting_run_marks_its_state_and_lists_the_false_guard(console: Console) -> None:
    page = await console.page()
    run_id = console.runs["waiting"]
    await page.goto(f"{console.url}#/runs/{run_id}")
    svg = page.get_by_role("group", name="State diagram of review")
    await svg.wait_for()
    current = svg.locator(".node.current")
    assert await current.get_attribute("data-state") == "approval"
    assert "current state" in (await current.get_attribute("aria-label") or "")
    visited = await svg.locator(".node.visited").evaluate_all("ns => ns.map(n => n.dataset.state)")
    assert sorted(visited) == ["approval", "scoring"]
    taken = await svg.locator(".edge.taken").evaluate_all(
        "es => es.map(e => e.dataset.from + '>' + e.dataset.to)"
    )
    assert "scoring>approval" in taken
    assert "scoring>merged" not in taken

    guard = page.locator(".guard[data-outcome='false']")
    await guard.first.wait_for()
    text = await guard.first.inner_text()
    assert "result.score > 7" in text
    assert "result.score = 5" in text
    assert "false" in text

    waits = page.get_by_role("table", name="Events that move it")
    assert "approval.granted" in await waits.inner_text()

    await svg.locator(".node[data-state='scoring']").focus()
    await page.keyboard.press("Enter")
    await page.get_by_role("heading", name="Visits of scoring").wait_for()
    await shot(page, "run", docs=True)
    assert page.errors == []


async def test_signal_moves_a_run_and_cancel_ends_one(console: Console) -> None:
    page = await console.page()
    run_id = console.runs["to-signal"]
    await page.goto(f"{console.url}#/runs/{run_id}")
    await page.get_by_role("button", name="Send signal…").click()
    await page.get_by_label("Event type").fill("approval.granted")
    await page.get_by_role("button", name="Send", exact=True).click()
    await page.locator("h1 + .status", has_text="completed").wait_for()
    await page.locator("svg .node.current[data-state='merged']").wait_for()
    await page.locator(".rec-transition-fired", has_text="approval.granted").wait_for()
    await wait_status(console.gs, run_id, "completed", "merged")

    run_id = console.runs["to-cancel"]
    await page.goto(f"{console.url}#/runs/{run_id}")
    await page.get_by_role("button", name="Cancel run…").click()
    dialog = page.get_by_role("dialog")
    await dialog.get_by_label("Reason").fill("checked in the browser")
    await shot(page, "cancel-confirm")
    await dialog.get_by_role("button", name="Cancel run").click()
    await page.locator("h1 + .status", has_text="cancelled").wait_for()
    await wait_status(console.gs, run_id, "cancelled")
    assert "checked in the browser" in await page.locator("main").inner_text()
    assert page.errors == []


async def test_a_failed_run_shows_its_error(console: Console) -> None:
    page = await console.page(width=390, height=844)
    await page.goto(f"{console.url}#/runs/{console.runs['failed']}")
    await page.get_by_role("heading", name="Error").wait_for()
    assert await page.locator("svg .node.current-failed").get_attribute("data-state") == "ask"
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, "the page scrolls sideways on a phone"
    await shot(page, "run-failed-phone", docs=True)
    assert page.errors == []


async def test_workflow_page_draws_its_diagram_and_diffs_two_versions(console: Console) -> None:
    page = await console.page()
    await page.goto(f"{console.url}#/workflows")
    await page.get_by_role("link", name="review", exact=True).click()
    await page.get_by_role("heading", name="Workflow review").wait_for()
    svg = page.get_by_role("group", name="State diagram of review")
    states = await svg.locator(".node").evaluate_all("ns => ns.map(n => n.dataset.state)")
    assert sorted(states) == ["approval", "merged", "rejected", "scoring"]
    await page.get_by_role("button", name="Show diff").click()
    diff = page.get_by_label("Manifest diff v1 to v2")
    await diff.wait_for()
    assert "result.score > 7" in await diff.locator("del").inner_text()
    assert "result.score >= 7" in await diff.locator("ins").inner_text()
    await shot(page, "workflow", docs=True)
    assert page.errors == []


async def test_agents_page_lists_capabilities_and_live_workers(console: Console) -> None:
    page = await console.page()
    await page.goto(f"{console.url}#/agents")
    caps = page.get_by_role("table", name="Capabilities")
    await caps.wait_for()
    text = await caps.inner_text()
    assert "echo" in text
    assert "liar" in text
    # The broken run's answer from liar failed its attempt: counted against liar.
    liar = caps.locator("tr", has=page.locator("code", has_text="liar"))
    assert "1 failed attempt" in await liar.inner_text()
    workers = page.get_by_role("table", name="Live workers")
    assert await workers.locator("tbody tr").count() >= 1
    assert page.errors == []


async def test_a_dead_letter_is_shown_and_redriven(console: Console) -> None:
    gs = console.gs
    page, link = await dead_letters_page(console, "com.example.broken")
    await shot(page, "dead-letters-one-reason")
    name = await link.inner_text()
    seq = int(name.lstrip("#"))
    await link.click()
    await page.get_by_role("heading", name=f"Dead letter #{seq}").wait_for()
    assert "bad-json" in await page.locator(".meta").inner_text()
    await shot(page, "dead-letter", docs=True)
    await page.get_by_role("button", name="Redrive…").click()
    await page.get_by_role("dialog").get_by_role("button", name="Redrive").click()
    await page.get_by_role("heading", name="Dead letters").wait_for()
    async with gs.http() as http:
        assert (await http.get(f"/dead-letters/{seq}")).status_code == 404
    assert page.errors == []


async def test_a_letter_that_cannot_be_redriven_says_why(console: Console) -> None:
    # Only the start of a message too large for a letter is kept: its page says it is
    # not redrivable, and why, and its Redrive button is off.
    gs = console.gs
    size = gs.stack.client.nc.max_payload - 4096
    body = b'{"blob": "' + b"x" * size + b'"}'
    await gs.stack.js.publish(gs.stack.subjects.event("com.example.huge"), body)
    seq = 0
    async with gs.http() as http:
        for _ in range(300):
            letters = (await http.get("/dead-letters", params={"reason": "too-large"})).json()
            if letters:
                seq = letters[-1]["seq"]
                break
            await asyncio.sleep(0.1)
    assert seq, "the event was never dead-lettered"
    page = await console.page()
    await page.goto(f"{console.url}#/dead-letters/{seq}")
    await page.get_by_role("heading", name=f"Dead letter #{seq}").wait_for()
    button = page.get_by_role("button", name="Redrive…")
    assert await button.is_disabled()
    why = await page.locator("#not-redrivable").inner_text()
    assert why.startswith("Not redrivable: it keeps only the first")
    assert await button.get_attribute("aria-describedby") == "not-redrivable"
    assert page.errors == []


OVERLAPS = """(svg) => {
  const boxes = [...svg.querySelectorAll('.node rect, .edge-label')]
    .map(e => [e.closest('[data-state]')?.dataset.state || e.textContent,
               e.getBoundingClientRect()]);
  const out = [];
  for (let i = 0; i < boxes.length; i++)
    for (let j = i + 1; j < boxes.length; j++) {
      const [a, p] = boxes[i], [b, q] = boxes[j];
      const apart = p.left >= q.right - 1 || q.left >= p.right - 1
        || p.top >= q.bottom - 1 || q.top >= p.bottom - 1;
      if (!apart)
        out.push(a + ' / ' + b);
    }
  return out;
}"""


async def test_large_diagrams_stay_readable(console: Console) -> None:
    """The most involved ported workflow (kxm's) and one of 20 states."""
    page = await console.page()
    for name, states in (("kxm-jira-development", 7), ("stages", 20)):
        await page.goto(f"{console.url}#/workflows/default/{name}")
        svg = page.get_by_role("group", name=f"State diagram of {name}")
        await svg.wait_for()
        assert await svg.locator(".node").count() == states
        # No state box or edge label covers another; text is drawn at its full size (the
        # diagram scrolls in its box rather than shrinking).
        assert await svg.evaluate(OVERLAPS) == [], name
        size = await svg.locator(".edge-label").first.evaluate(
            "e => e.getBoundingClientRect().height"
        )
        assert size >= 11, name
        await shot(page, f"workflow-{name}", docs=name.startswith("kxm"))
    assert page.errors == []


# -- accessibility: the keyboard, labels, contrast ----------------------------------------


async def test_the_keyboard_reaches_filters_rows_and_buttons(console: Console) -> None:
    page = await console.page()
    await page.goto(console.url)
    await page.locator("#runs-listing table").wait_for()
    target = console.runs["to-keyboard"]
    stops = await tab_until(page, target)
    # In reading order: the skip link, the sections, the filters, the run id box, the rows.
    wanted = ["Skip to content", "|Runs", "f-workflow", "f-status", "f-since", "f-until", "run-id"]
    at = [next(i for i, s in enumerate(stops) if w in s) for w in wanted]
    assert at == sorted(at), stops
    assert stops[-1].startswith("a|")
    # Enter on a row's link opens the run.
    await page.keyboard.press("Enter")
    await page.get_by_role("heading", name=f"Run {target}").wait_for()
    # The cancel button is reached from the keyboard; its confirmation is a dialog that
    # Escape closes without cancelling, and that Enter on its button confirms.
    dialog = await confirmation_escaped(page, "Cancel run…")
    async with console.gs.http() as http:
        assert (await http.get(f"/runs/{target}")).json()["status"] == "running"
    await page.locator("#cancel").focus()
    await page.keyboard.press("Enter")
    await dialog.wait_for()
    # The dialog puts the focus on its first field.
    assert await page.evaluate("document.activeElement.id") == "cancel-reason"
    await page.keyboard.press("Control+A")
    await page.keyboard.type("from the keyboard")
    await tab_until(page, "|Cancel run", most=5)
    await page.keyboard.press("Enter")
    await page.locator("h1 + .status", has_text="cancelled").wait_for()
    await wait_status(console.gs, target, "cancelled")
    assert page.errors == []


async def test_every_control_is_labelled_and_text_meets_contrast(console: Console) -> None:
    """At a laptop's size and a phone's, on every page: each control has a name, and each
    piece of text is at least 4.5:1 against what is behind it (3:1 when large),
    computed from the colours the browser applied."""
    pages = {
        "runs": ("#/runs", "#runs-listing table"),
        "run": (f"#/runs/{console.runs['waiting']}", ".guard"),
        "failed run": (f"#/runs/{console.runs['failed']}", "svg .node.current"),
        "workflow": ("#/workflows/default/review", "svg .node"),
        "workflows": ("#/workflows", "table"),
        "agents": ("#/agents", "table"),
        "dead letters": ("#/dead-letters", "h1"),
    }
    for width, height in ((1280, 800), (390, 844)):
        page = await console.page(width=width, height=height)
        for name, (where, ready) in pages.items():
            # The page before stays until the next one replaces it, and may hold what the
            # next is waited for by (a table, a heading): wait for it inside the new one.
            await page.evaluate(
                "() => { for (const e of document.querySelectorAll('main > *'))"
                " e.classList.add('stale'); }"
            )
            await page.goto(f"{console.url}{where}")
            await page.locator(f"main > .page:not(.stale) {ready}").first.wait_for()
            assert await page.evaluate(UNLABELLED) == [], (name, width)
            got = await page.evaluate(CONTRAST)
            assert got["failures"] == [], (name, width, got["failures"])
            assert got["checked"] >= 5, (name, width, got)
            if width < 1280:
                await shot(page, f"phone-{name.replace(' ', '-')}")
        # The check sees what it should: grey text on white (2.8:1) is caught.
        await page.evaluate(
            """() => {
              const p = document.createElement('p');
              p.textContent = 'too faint';
              p.style.color = '#949494';
              document.querySelector('main h1').after(p);
            }"""
        )
        caught = (await page.evaluate(CONTRAST))["failures"]
        assert [f["text"] for f in caught] == ["too faint"], caught
        assert page.errors == []


async def test_a_long_log_shows_its_newest_page_and_reads_earlier_ones_when_asked(
    console: Console,
) -> None:
    """A run of more records than a page: its page reads the newest 200 of its log, and
    "Earlier records" reads the page before, one request a page. The gateway has not kept
    the log (as after a start)."""
    console.gs.gateway.run_logs.forget()
    page = await console.page(token=None)
    asked: list[str] = []
    page.on(
        "request",
        lambda r: asked.append(r.url) if re.search(r"/runs/[^/]+/log(\?|$)", r.url) else None,
    )
    run_id = console.runs["long"]
    await page.goto(f"{console.url}#/runs/{run_id}")
    await sign_in(page, console.gs.tokens["reader"])
    records = page.locator(".timeline .rec")
    total = int(await page.locator(".meta dd").nth(5).inner_text())
    assert 400 < total <= 600
    await page.locator(f"#rec-{total}").wait_for(state="attached")

    async def shown() -> list[int]:
        ids = await records.evaluate_all("rows => rows.map(r => r.id)")
        return [int(i.removeprefix("rec-")) for i in ids]

    assert await shown() == list(range(total - 199, total + 1))
    assert len(asked) == 1, asked
    assert f"offset={total - 200}" in asked[0]
    assert await page.locator(".visit h3").first.inner_text() == "Continued from earlier records"
    # The run ended in a state whose visit is among the records read: the diagram marks it,
    # and choosing the state and its visit goes there.
    svg = page.get_by_role("group", name="State diagram of looper")
    assert await svg.locator(".node.current").get_attribute("data-state") == "done"
    await svg.locator(".node[data-state='done']").click()
    heading = page.locator(".visits h3")
    assert await heading.inner_text() == "Visits of done in the records read"
    await page.get_by_role("button", name="Visit 1").click()
    assert await page.evaluate("document.activeElement.dataset.state") == "done"

    # "Earlier records": the page before, then the first records, and no more to ask for.
    earlier = page.locator("#timeline-earlier")
    await earlier.click()
    await page.locator(f"#rec-{total - 399}").wait_for(state="attached")
    assert await shown() == list(range(total - 399, total + 1))
    assert len(asked) == 2, asked
    await earlier.click()
    await page.locator("#rec-1").wait_for(state="attached")
    assert await shown() == list(range(1, total + 1))
    assert await earlier.is_hidden()
    assert await page.locator(".visit h3").first.inner_text() == "Start"
    assert len(asked) == 3, asked
    assert page.errors == []


async def test_runs_are_filtered_by_start_date_and_time(console: Console) -> None:
    page = await console.page()
    await page.goto(console.url)
    await page.locator("#runs-listing table").wait_for()
    async with console.gs.http() as http:
        started = (await http.get(f"/runs/{console.runs['long']}")).json()["started_at"]
    # To the second, in UTC as the table shows it: the run started in that second is in,
    # from the next second on it is not.
    second = started[:19]
    await page.get_by_label("Started at or after (UTC)").fill(second)
    await page.get_by_label("Started at or after (UTC)").dispatch_event("change")
    link = page.get_by_role("link", name=console.runs["long"])
    await link.wait_for()
    assert f"since={second.replace(':', '%3A')}" in page.url
    later = (datetime.fromisoformat(second) + timedelta(seconds=1)).isoformat()
    await page.get_by_label("Started at or after (UTC)").fill(later)
    await page.get_by_label("Started at or after (UTC)").dispatch_event("change")
    await link.wait_for(state="detached")
    await page.get_by_label("Started before (UTC)").fill(later)
    await page.get_by_label("Started before (UTC)").dispatch_event("change")
    await page.get_by_text("No runs match.").wait_for()
    # On a whole minute the field leaves the seconds out of its value; the link keeps
    # them, so the same second is always written the same way.
    await page.get_by_label("Started before (UTC)").fill("2020-01-01T00:00:00")
    await page.get_by_label("Started before (UTC)").dispatch_event("change")
    await page.wait_for_function("location.hash.includes('until=2020-01-01T00%3A00%3A00')")
    assert page.errors == []


async def test_the_runs_page_follows_the_run_index_live(console: Console) -> None:
    page = await console.page()
    async with page.expect_response(lambda r: r.url.endswith("/live/runs")) as streamed:
        await page.goto(console.url)
        await page.locator("#runs-listing table").wait_for()
    assert (await streamed.value).status == 200
    async with console.gs.http() as http:
        r = await http.post("/runs", json={"workflow": "hello", "inputs": {"message": "live"}})
        run_id = r.json()["run_id"]
    # The new run shows up (and then as completed) without the page being loaded again.
    row = page.locator("#runs-listing tr", has=page.get_by_role("link", name=run_id))
    await row.locator(".status", has_text="completed").wait_for()
    assert page.errors == []


async def test_the_keyboard_reaches_workflows_versions_and_the_diff(console: Console) -> None:
    page = await console.page()
    await page.goto(f"{console.url}#/workflows")
    await page.get_by_role("table", name="Workflows").wait_for()
    stops = await tab_until(page, "a||review")
    # In reading order: the skip link, the sections, then the table's links.
    wanted = ["Skip to content", "|Workflows", "|Dead letters", "a||review"]
    at = [next(i for i, s in enumerate(stops) if w in s) for w in wanted]
    assert at == sorted(at), stops
    await page.keyboard.press("Enter")
    await page.get_by_role("heading", name="Workflow review").wait_for()
    # Its versions, its runs, the manifest, then the diff's From, To and button.
    stops = await tab_until(page, "Show diff")
    wanted = ["a||v1", "a||v2", "runs of this workflow", "select|diff-a", "select|diff-b"]
    at = [next(i for i, s in enumerate(stops) if w in s) for w in wanted]
    assert at == sorted(at), stops
    await page.keyboard.press("Enter")
    status = page.get_by_role("status").filter(has_text="v1 → v2")
    await status.wait_for()
    assert "lines added" in await status.inner_text()
    # Enter on a version's link opens that version.
    await page.locator("a.chip", has_text="v1").focus()
    await page.keyboard.press("Enter")
    await page.wait_for_function("location.hash.endsWith('version=1')")
    assert page.errors == []


async def test_the_keyboard_reaches_an_agents_failure_and_its_run(console: Console) -> None:
    page = await console.page()
    await page.goto(f"{console.url}#/agents")
    caps = page.get_by_role("table", name="Capabilities")
    await caps.wait_for()
    liar = caps.locator("tr", has=page.locator("code", has_text="liar"))
    error = await liar.locator(".failures a").inner_text()
    stops = await tab_until(page, f"a||{error}")
    wanted = ["Skip to content", "|Agents", f"a||{error}"]
    at = [next(i for i, s in enumerate(stops) if w in s) for w in wanted]
    assert at == sorted(at), stops
    await page.keyboard.press("Enter")
    await page.get_by_role("heading", name=f"Run {console.runs['failed']}").wait_for()
    assert page.errors == []


async def test_the_keyboard_opens_a_dead_letter_and_its_redrive_confirmation(
    console: Console,
) -> None:
    gs = console.gs
    page, link = await dead_letters_page(console, "com.example.keyboard")
    name = await link.inner_text()
    stops = await tab_until(page, f"a||{name}")
    wanted = ["Skip to content", "|Dead letters", f"a||{name}"]
    at = [next(i for i, s in enumerate(stops) if w in s) for w in wanted]
    assert at == sorted(at), stops
    await page.keyboard.press("Enter")
    await page.get_by_role("heading", name=f"Dead letter {name}").wait_for()
    # Redrive's confirmation opens from the keyboard; Escape closes it, nothing redriven.
    await confirmation_escaped(page, "Redrive…")
    async with gs.http() as http:
        assert (await http.get(f"/dead-letters/{name.lstrip('#')}")).status_code == 200
    assert page.errors == []
