"""The console's test stack: a real stack (nats-server, orchestrator, test agent, the gateway
on a socket) with runs in every status, headless Chromium, and what the browser tests share
(signing in, screenshots, the keyboard, labels and contrast checks).

Each test module that uses the ``console`` fixture gets its own stack and browser; each
test opens its own page. Screenshots go to ``.artifacts/console/`` (and, with
``INTERLOCK_DOCS_SCREENSHOTS=1``, to docs/console/)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_asyncio

from interlock.transport.subjects import Subjects
from support.console import ARTIFACTS, DOCS_SHOTS, chromium, playwright_or_skip
from support.gateway import (
    BROKEN,
    HELLO,
    HOOK,
    IDLE_AGENT,
    REVIEW,
    REVIEW_V2,
    TIMEOUT,
    UNSERVED,
    GatewayStack,
    gateway_stack,
    wait_status,
    yaml,
)

PORTS = Path(__file__).resolve().parents[2] / "examples" / "ports"


LOOPER = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: looper
    spec:
      initial_state: poll
      states:
        poll:
          loop:
            until: iteration >= 220
            max_iterations: 220
            action:
              capability: echo
              input: {iteration: "{{ iteration }}"}
          on:
            - {event: task.completed, guard: "result.iteration > 0", goto: done}
        done:
          type: terminal
    """
)
"""A run whose log is longer than the timeline draws at once and than "Show all" draws in
its first step (about 445 records)."""


MAPPED = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: mapped
    spec:
      inputs:
        items: {type: "list[integer]", required: true}
      initial_state: fan
      states:
        fan:
          map:
            over: inputs.items
            as: n
            parallelism: 2
            action:
              capability: echo
              input: {n: "{{ n }}"}
          on:
            - {event: task.completed, goto: done}
        done:
          type: terminal
          outputs: {results: "$.states.fan.output"}
    """
)
"""A map of echo over its items, two at a time, joining all (the record leaves the join
out: it is the default)."""


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
    """What each named run is: completed, failed, cancelled, waiting, to-cancel, to-signal,
    to-keyboard, long, unserved (waits for a capability no worker serves), hook (waits
    for an event), forked (a fork of waiting), mapped (a completed map of six items)."""

    @property
    def url(self) -> str:
        return f"{self.gs.url}/ui/"

    async def page(self, width: int = 1280, height: int = 800, *, token: str | None = "") -> Any:
        """A signed-in page (the operator's token, or ``token``, in this tab's session
        storage; ``token=None``: signed out, as a person's first visit is)."""
        context = await self.browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(TIMEOUT * 2000)
        token = self.gs.tokens["operator"] if token == "" else token
        if token is not None:
            await context.add_init_script(f"sessionStorage.setItem('interlock.token', {token!r})")
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.errors = errors
        return page


async def sign_in(page: Any, token: str) -> None:
    """Sign in as a person does: the token typed into the form the page shows."""
    form = page.locator("form.sign-in")
    await form.wait_for()
    await page.get_by_label("Bearer token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await form.wait_for(state="detached")


async def shot(page: Any, name: str, *, docs: bool = False) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    if docs and os.environ.get("INTERLOCK_DOCS_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        height = await page.evaluate("document.documentElement.scrollHeight")
        width = page.viewport_size["width"]
        clip = {"x": 0, "y": 0, "width": width, "height": min(height, 1500)}
        await page.screenshot(path=str(DOCS_SHOTS / f"{name}.png"), full_page=True, clip=clip)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def console(nats_url: str) -> AsyncIterator[Console]:
    playwright_or_skip()
    executable = chromium()
    from playwright.async_api import async_playwright

    subjects = Subjects(prefix=f"t{uuid.uuid4().hex[:12]}")
    async with (
        gateway_stack(
            nats_url, subjects, [HELLO, REVIEW, BROKEN, LOOPER, IDLE_AGENT, UNSERVED, HOOK, MAPPED]
        ) as gs,
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
            await wait_status(gs, await start("long", "looper", {}), "completed")
            for name in ("waiting", "to-cancel", "to-signal", "to-keyboard", "cancelled"):
                run_id = await start(name, "review", {"score": 5})
                await wait_status(gs, run_id, "running", "approval")
            await wait_status(gs, await start("unserved", "unserved", {}), "running", "ask")
            await wait_status(gs, await start("hook", "hook", {}), "running", "deploying")
            mapped = await start("mapped", "mapped", {"items": [1, 2, 3, 4, 5, 6]})
            await wait_status(gs, mapped, "completed")
            # A fork of the waiting run, from its whole log.
            waiting = c.runs["waiting"]
            records = (await http.get(f"/runs/{waiting}")).json()["records"]
            c.runs["forked"] = await gs.gateway.api.fork(waiting, records)
            await wait_status(gs, c.runs["forked"], "running", "approval")
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


FOCUS_NAME = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return '';
  const label = e.labels?.[0]?.textContent || e.getAttribute('aria-label') || '';
  return [e.tagName.toLowerCase(), e.id || '', (label || e.textContent || '').trim().slice(0, 60)]
    .join('|');
}"""


async def tab_until(page: Any, done: str, most: int = 80) -> list[str]:
    """Press Tab until the focused element's description contains ``done``; the stops."""
    stops: list[str] = []
    for _ in range(most):
        await page.keyboard.press("Tab")
        stops.append(await page.evaluate(FOCUS_NAME))
        if done in stops[-1]:
            return stops
    raise AssertionError(f"Tab never reached {done!r}: {stops}")


async def confirmation_escaped(page: Any, button: str) -> Any:
    """Reach ``button`` from the keyboard and press Enter: its confirmation dialog opens
    with the focus inside it, and Escape closes it. The dialog's locator."""
    await tab_until(page, button)
    await page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog")
    await dialog.wait_for()
    assert await page.evaluate("document.activeElement.closest('dialog') !== null")
    await page.keyboard.press("Escape")
    await dialog.wait_for(state="detached")
    return dialog


async def dead_letters_page(console: Console, event_type: str) -> tuple[Any, Any]:
    """Dead-letter an event of ``event_type`` (not JSON) and open the dead letters page
    until it lists one: the page and the first letter's link."""
    gs = console.gs
    await gs.stack.js.publish(gs.stack.subjects.event(event_type), b"{not json")
    page = await console.page()
    await page.goto(f"{console.url}#/dead-letters")
    link = page.locator("main table a").first
    for _ in range(300):
        # Drawn once its reads are answered, after the reload returns: look at the page
        # drawn, not at one still reading.
        await page.get_by_role("heading", name="Dead letters").wait_for()
        if await link.count():
            break
        await asyncio.sleep(0.1)
        await page.reload()
    return page, link


UNLABELLED = """() => [...document.querySelectorAll('input, select, textarea, button, a[href]')]
  .filter(e => e.getClientRects().length)
  .filter(e => {
    const named = (e.labels && e.labels.length) || e.getAttribute('aria-label')
      || e.getAttribute('aria-labelledby') || e.textContent.trim();
    return !named;
  })
  .map(e => e.outerHTML.slice(0, 120))"""

CONTRAST = """() => {
  const rgba = (c) => {
    const m = /rgba?\\(([^)]+)\\)/.exec(c || '');
    if (!m) return null;
    const p = m[1].split(/[\\s,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, under) => {
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a)).concat(1);
  };
  const lum = (c) => {
    const [r, g, b] = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => {
    const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
    return (x + 0.05) / (y + 0.05);
  };
  // The colour behind an HTML element: its own and its ancestors' backgrounds, composed.
  const behind = (el) => {
    const layers = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const bg = rgba(getComputedStyle(e).backgroundColor);
      if (bg && bg[3] > 0) {
        layers.push(bg);
        if (bg[3] >= 1) break;
      }
    }
    return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255, 1]);
  };
  const fill = (el) => rgba(getComputedStyle(el).fill);
  const failures = [];
  let checked = 0;
  for (const el of document.querySelectorAll('body *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length) continue;
    const style = getComputedStyle(el);
    if (style.visibility !== 'visible') continue;
    if (el.closest('[disabled], .visually-hidden, title')) continue;
    let opacity = 1;
    for (let e = el; e && e.nodeType === 1; e = e.parentElement)
      opacity *= Number(getComputedStyle(e).opacity);
    if (opacity === 0) continue;
    let fg, bg;
    if (el instanceof SVGElement) {
      fg = fill(el);
      const node = el.closest('.node');
      if (el.classList.contains('badge-text')) bg = fill(el.previousElementSibling);
      else if (node) bg = over(fill(node.querySelector('rect')), behind(el.closest('svg')));
      else bg = behind(el.closest('svg'));
    } else {
      fg = rgba(style.color);
      bg = behind(el);
    }
    if (!fg || !bg) {
      failures.push({text: el.textContent.trim().slice(0, 40), why: 'colour not read'});
      continue;
    }
    fg = over([...fg.slice(0, 3), fg[3] * opacity], bg);
    const size = parseFloat(style.fontSize);
    const bold = Number(style.fontWeight) >= 700;
    const large = size >= 24 || (bold && size >= 18.66);
    const need = large ? 3 : 4.5;
    const got = ratio(fg, bg);
    checked += 1;
    if (got < need) failures.push({
      text: el.textContent.trim().slice(0, 40), cls: String(el.className?.baseVal ?? el.className),
      fg: fg.map(Math.round).join(','), bg: bg.map(Math.round).join(','), ratio: got.toFixed(2),
    });
  }
  return {checked, failures};
}"""
