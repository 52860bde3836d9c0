"""The web console in headless Chromium against a real stack: each page loaded, and what a
person would check on it (the diagram marks the right state, the timeline names the guard
that was false, cancel ends a run, a signal moves one, a dead letter redrives).

One stack and one browser for the module; each test opens its own page. Screenshots go to
``.artifacts/console/`` (and, with ``INTERLOCK_DOCS_SCREENSHOTS=1``, to docs/console/)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from console_support import ARTIFACTS, DOCS_SHOTS, chromium, playwright_or_skip
from gw_support import HELLO, TIMEOUT, GatewayStack, gateway_stack, yaml

from interlock.transport.subjects import Subjects

PORTS = Path(__file__).resolve().parents[2] / "examples" / "ports"

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

REVIEW = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: review
    spec:
      description: A score above 7 merges at once; anything else waits for a person.
      inputs:
        score: {type: integer, required: true}
      initial_state: scoring
      states:
        scoring:
          actions:
            - capability: echo
              input: {score: "{{ inputs.score }}"}
          on:
            - {event: task.completed, guard: "result.score > 7", goto: merged}
            - {event: task.completed, goto: approval}
        approval:
          type: human_in_the_loop
          on:
            - {event: approval.granted, goto: merged}
            - {event: approval.denied, goto: rejected}
        merged:
          type: terminal
          outputs: {merged: true}
        rejected:
          type: terminal
          outputs: {merged: false}
    """
)
REVIEW_V2 = REVIEW.replace("result.score > 7", "result.score >= 7")
BROKEN = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: broken
    spec:
      initial_state: ask
      states:
        ask:
          actions:
            - capability: liar
              input: {}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
    """
)


def _stages(n: int) -> str:
    """A workflow of ``n`` states: a line of steps, each able to go on, go back or fail."""
    steps = [f"s{i:02d}" for i in range(1, n - 1)]
    lines = [
        "apiVersion: interlock.io/v1",
        "kind: Workflow",
        "metadata: {name: stages}",
        "spec:",
        f"  initial_state: {steps[0]}",
        "  states:",
    ]
    for i, step in enumerate(steps):
        following = steps[i + 1] if i + 1 < len(steps) else "done"
        lines += [
            f"    {step}:",
            "      type: human_in_the_loop",
            "      on:",
            f"        - {{event: step.done, goto: {following}}}",
            "        - {event: step.failed, goto: failed}",
        ]
        if i % 3 == 2:
            lines.append(f"        - {{event: step.redo, goto: {steps[i - 2]}}}")
    lines += ["    done: {type: terminal}", "    failed: {type: terminal}"]
    return "\n".join(lines) + "\n"


STAGES = _stages(20)


@dataclass
class Console:
    gs: GatewayStack
    browser: Any
    runs: dict[str, str] = field(default_factory=dict)
    """What each named run is: completed, failed, cancelled, waiting, to-cancel, to-signal."""

    @property
    def url(self) -> str:
        return f"{self.gs.url}/ui/"

    async def page(self, width: int = 1280, height: int = 800) -> Any:
        """A signed-in page (the operator's token in this tab's session storage)."""
        context = await self.browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(TIMEOUT * 3000)
        token = self.gs.tokens["operator"]
        await context.add_init_script(f"sessionStorage.setItem('interlock.token', {token!r})")
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.errors = errors
        return page


async def shot(page: Any, name: str, *, docs: bool = False) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    if docs and os.environ.get("INTERLOCK_DOCS_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        height = await page.evaluate("document.documentElement.scrollHeight")
        width = page.viewport_size["width"]
        clip = {"x": 0, "y": 0, "width": width, "height": min(height, 1500)}
        await page.screenshot(path=str(DOCS_SHOTS / f"{name}.png"), full_page=True, clip=clip)


async def wait_status(gs: GatewayStack, run_id: str, want: str, state: str | None = None) -> None:
    async with gs.http() as http:
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while True:
            got = (await http.get(f"/runs/{run_id}")).json()
            if got["status"] == want and (state is None or got["state"] == state):
                return
            assert asyncio.get_running_loop().time() < deadline, got
            await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def console(nats_url: str) -> AsyncIterator[Console]:
    playwright_or_skip()
    executable = chromium()
    from playwright.async_api import async_playwright

    subjects = Subjects(prefix=f"t{uuid.uuid4().hex[:12]}")
    async with (
        gateway_stack(nats_url, subjects, [HELLO, REVIEW, BROKEN]) as gs,
        async_playwright() as pw,
    ):
        browser = await pw.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        c = Console(gs, browser)
        async with gs.http() as http:

            async def start(name: str, workflow: str, inputs: dict[str, Any]) -> str:
                r = await http.post("/runs", json={"workflow": workflow, "inputs": inputs})
                assert r.status_code == 201, r.text
                c.runs[name] = run_id = r.json()["run_id"]
                return run_id

            await wait_status(gs, await start("completed", "hello", {"message": "hi"}), "completed")
            await wait_status(gs, await start("failed", "broken", {}), "failed")
            for name in ("waiting", "to-cancel", "to-signal", "cancelled"):
                run_id = await start(name, "review", {"score": 5})
                await wait_status(gs, run_id, "running", "approval")
            cancelled = c.runs["cancelled"]
            r = await http.post(f"/runs/{cancelled}/cancel", json={"reason": "not needed"})
            assert r.json()["cancelled"] is True
            await wait_status(gs, c.runs["cancelled"], "cancelled")
        # Runs so far ran v1; v2 only changes a guard (for the diff and the replay).
        await gs.stack.apply(REVIEW_V2)
        await gs.stack.apply(
            (PORTS / "kxm-agents.yaml").read_text(),
            (PORTS / "kxm-jira-development.yaml").read_text(),
            STAGES,
        )
        try:
            yield c
        finally:
            await browser.close()


async def test_runs_page_lists_runs_of_every_status_and_filters(console: Console) -> None:
    page = await console.page()
    await page.goto(console.url)
    table = page.locator("#runs-listing table")
    await table.wait_for()
    for run_id in console.runs.values():
        await page.get_by_role("link", name=run_id).wait_for()
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
    caps = page.get_by_role("table", name="Capabilities of testagent")
    await caps.wait_for()
    text = await caps.inner_text()
    assert "echo" in text
    assert "liar" in text
    workers = page.get_by_role("table", name="Live workers of testagent")
    assert await workers.locator("tbody tr").count() >= 1
    await shot(page, "agents", docs=True)
    assert page.errors == []


async def test_a_dead_letter_is_shown_and_redriven(console: Console) -> None:
    gs = console.gs
    await gs.stack.js.publish(gs.stack.subjects.event("com.example.broken"), b"{not json")
    page = await console.page()
    await page.goto(f"{console.url}#/dead-letters")
    link = page.locator("main table a").first
    for _ in range(100):
        if await link.count():
            break
        await asyncio.sleep(0.1)
        await page.reload()
    await shot(page, "dead-letters", docs=True)
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
