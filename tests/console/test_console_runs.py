"""The runs page as an operator uses it: what each waiting run waits for, filtered by it,
where a forked run came from; on a phone the table fits and the navigation stays."""

from __future__ import annotations

import pytest
from console_stack import UNLABELLED, Console, console, shot, sign_in

__all__ = ["console"]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]


STATUS_BOX = """(runId) => {
  const link = document.querySelector(`#runs-listing tr td > a[href='#/runs/${runId}']`);
  const cell = link?.closest("tr")?.querySelector("td[data-label='Status']");
  const box = cell?.getBoundingClientRect();
  return box ? { x: box.x, width: box.width } : null;
}"""
"""The run's Status cell's box in the runs listing, or null if it has no row."""


def row(page, run_id: str):  # type: ignore[no-untyped-def]
    """The run's row (not one that links to it as its origin)."""
    return page.locator("#runs-listing tr", has=page.locator(f"td > a[href='#/runs/{run_id}']"))


async def test_runs_say_what_they_wait_for_and_filter_by_it(console: Console) -> None:
    page = await console.page(token=None)
    await page.goto(console.url)
    await sign_in(page, console.gs.tokens["reader"])
    runs = console.runs
    await row(page, runs["unserved"]).wait_for()
    waits = {
        name: await row(page, runs[name]).locator("td[data-label='Waiting for']").inner_text()
        for name in ("waiting", "unserved", "hook", "completed")
    }
    assert waits == {
        "waiting": "approval approval.granted, approval.denied",
        "unserved": "agent nobody; timer to gave-up",
        "hook": "event deploy.finished",
        "completed": "",
    }
    forked = row(page, runs["forked"])
    assert f"forked from {runs['waiting']} at #" in await forked.inner_text()
    await forked.get_by_role("link", name=runs["waiting"]).wait_for()
    # The fork's own start, not its origin's (its copied run.started holds that).
    started = "td[data-label='Started'] time"
    fork_start = await forked.locator(started).get_attribute("datetime")
    origin_start = await row(page, runs["waiting"]).locator(started).get_attribute("datetime")
    assert fork_start is not None
    assert origin_start is not None
    assert fork_start > origin_start

    await page.get_by_label("Waiting for").select_option("agent")
    await page.wait_for_function("location.hash.includes('waiting=agent')")
    await row(page, runs["waiting"]).wait_for(state="detached")
    assert await page.locator("#runs-listing tbody tr").count() == 1
    await row(page, runs["unserved"]).wait_for()
    await page.get_by_label("Waiting for").select_option("approval")
    await row(page, runs["unserved"]).wait_for(state="detached")
    await row(page, runs["waiting"]).wait_for()
    assert await page.evaluate(UNLABELLED) == []
    assert page.errors == []


async def test_on_a_phone_the_table_fits_and_the_navigation_stays(console: Console) -> None:
    page = await console.page(390, 844)
    await page.goto(console.url)
    target = row(page, console.runs["waiting"])
    await target.wait_for()
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    status = target.locator("td[data-label='Status']")
    # Measured in one turn of the page: live updates redraw the listing, and a cell found
    # first and measured after (Locator.bounding_box) may be gone by then (no box).
    box = await page.evaluate(STATUS_BOX, console.runs["waiting"])
    assert box is not None
    assert box["x"] >= 0
    assert box["x"] + box["width"] <= 390
    assert await status.is_visible()
    await shot(page, "runs-phone", docs=True)
    # Down the list, into a run, then to another section: each page opens at its top with
    # the navigation on screen.
    link = target.locator(f"td > a[href='#/runs/{console.runs['waiting']}']")
    await link.scroll_into_view_if_needed()
    await link.click()
    await page.get_by_role("heading", name=f"Run {console.runs['waiting']}").wait_for()
    nav = page.get_by_role("navigation", name="Sections")
    for section, heading in (("Agents", "Agents"), ("Runs", "Runs")):
        await page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        await nav.get_by_role("link", name=section).click()
        await page.get_by_role("heading", name=heading, exact=True).wait_for()
        await page.wait_for_function("window.scrollY === 0")
        box = await nav.bounding_box()
        assert box is not None
        assert box["y"] >= 0, section
    assert page.errors == []
