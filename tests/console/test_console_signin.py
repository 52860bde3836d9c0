"""Signing in as a person does: the console opened without a token, on any page, shows the
sign-in form (never only a 401 box), and the token typed there opens the page asked for."""

from __future__ import annotations

import pytest
from console_stack import UNLABELLED, Console, console, shot, sign_in

__all__ = ["console"]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]


def pages(c: Console) -> dict[str, tuple[str, str]]:
    """Each page's address and the heading it shows once signed in."""
    run_id = c.runs["waiting"]
    return {
        "first page": ("", "Runs"),
        "runs": ("#/runs?status=running", "Runs"),
        "run": (f"#/runs/{run_id}", f"Run {run_id}"),
        "workflows": ("#/workflows", "Workflows"),
        "workflow": ("#/workflows/default/review", "Workflow review"),
        "agents": ("#/agents", "Agents"),
        "dead letters": ("#/dead-letters", "Dead letters"),
    }


@pytest.mark.parametrize("size", [(1280, 800), (390, 844)], ids=["laptop", "phone"])
async def test_every_page_opens_on_the_sign_in_form(
    console: Console, size: tuple[int, int]
) -> None:
    token = console.gs.tokens["operator"]
    for name, (where, heading) in pages(console).items():
        page = await console.page(*size, token=None)
        await page.goto(f"{console.url}{where}")
        await page.get_by_role("heading", name="Sign in").wait_for()
        # The form, and no error box in its place.
        assert await page.locator("[role=alert]").count() == 0, name
        assert await page.evaluate("document.activeElement.id") == "token", name
        assert await page.evaluate(UNLABELLED) == [], name
        if name == "first page" and size[0] == 1280:
            await shot(page, "sign-in")
        await sign_in(page, token)
        await page.get_by_role("heading", name=heading, exact=True).wait_for()
        assert await page.get_by_role("button", name="Sign out").is_visible(), name
        assert page.errors == [], name
        await page.context.close()


async def test_a_wrong_token_says_so_and_the_right_one_then_signs_in(console: Console) -> None:
    page = await console.page(token=None)
    await page.goto(console.url)
    await page.get_by_label("Bearer token").fill("not-a-token")
    await page.get_by_role("button", name="Sign in").click()
    await page.locator("form.sign-in", has_text="not accepted").wait_for()
    await sign_in(page, console.gs.tokens["reader"])
    await page.get_by_role("heading", name="Runs", exact=True).wait_for()
    # Signing out brings the form back in the page's place.
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("heading", name="Sign in").wait_for()
    assert await page.locator("#runs-listing").count() == 0
    assert page.errors == []


async def test_a_publishers_token_is_refused_at_sign_in_saying_what_it_may_do(
    console: Console,
) -> None:
    page = await console.page(token=None)
    await page.goto(console.url)
    await page.get_by_label("Bearer token").fill(console.gs.tokens["publisher"])
    await page.get_by_role("button", name="Sign in").click()
    form = page.locator("form.sign-in", has_text="That token is a publisher's")
    await form.wait_for()
    text = await form.inner_text()
    assert "may only send events (POST /events) of the types com.example.*" in text
    assert "reading takes a reader's or an operator's token" in text
    assert await page.locator("[role=alert]").count() == 0  # the form, no bare 403
    assert await page.get_by_role("button", name="Sign out").is_hidden()
    await sign_in(page, console.gs.tokens["reader"])
    await page.get_by_role("heading", name="Runs", exact=True).wait_for()
    assert page.errors == []
