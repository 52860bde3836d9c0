"""``GET /queues`` and ``interlock queues`` a page at a time: a reader's token over a real
socket follows the ``Link`` header (rel="next") from the first page to the last, which
has none, and the pages together are the whole listing, in limit then key order; the CLI
on an operator's credential (as ``interlock creds issue`` makes it) pages with ``--limit``
and ``--after``, saying how to ask for the next page; a page token that names nothing is
refused (400, exit 2)."""

from __future__ import annotations

import asyncio
import json
import re

from interlock.client import Client
from interlock.transport.subjects import Subjects
from support.accounts import issued_creds
from support.gateway import gateway_stack
from support.runtime import cli_env, eventually, run_cli

HOLDING = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: holding}
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
CUSTOMERS = ("c0", "c1", "c2", "c3", "c4")
NEXT = re.compile(r'^<([^>]+)>; rel="next"$')


async def test_queues_come_a_page_at_a_time(nats_url: str, subjects: Subjects) -> None:
    async with gateway_stack(nats_url, subjects, [HOLDING]) as gs:
        client = Client(gs.stack.client.nc, gs.stack.subjects)
        for customer in CUSTOMERS:
            await client.start("holding", {"customer": customer}, run_id=f"qp-{customer}")

        async def every_key_held() -> bool:
            found = await client.queues("holding")
            return [q.key for q in found] == list(CUSTOMERS)

        await eventually(every_key_held, what="a line for each customer")
        whole = [(q.limit, q.key) for q in await client.queues("holding")]

        async with gs.http("reader") as http:
            pages: list[list[tuple[str, str]]] = []
            answer = await http.get("/queues", params={"workflow": "holding", "limit": 2})
            while True:
                assert answer.status_code == 200, answer.text
                pages.append([(q["limit"], q["key"]) for q in answer.json()])
                link = answer.headers.get("Link")
                if link is None:
                    break
                found = NEXT.match(link)
                assert found is not None, link
                assert "workflow=holding" in found.group(1)
                answer = await http.get(found.group(1))
            assert [len(p) for p in pages] == [2, 2, 1]
            assert [line for page in pages for line in page] == whole
            # Without limit: every line, as before pages (at most 500 a page).
            answer = await http.get("/queues", params={"workflow": "holding"})
            assert [(q["limit"], q["key"]) for q in answer.json()] == whole
            assert "Link" not in answer.headers
            for bad in ({"after": "not-a-token"}, {"limit": 0}, {"limit": 501}):
                refused = await http.get("/queues", params=bad)
                assert refused.status_code == 400, (bad, refused.text)
                assert refused.json()["type"].endswith("bad-parameter"), refused.text

        operator = await issued_creds(nats_url, subjects, "operator")
        assert operator is not None
        env = cli_env(nats_url, subjects.prefix, INTERLOCK_CREDS=str(operator))
        args = ["queues", "--workflow", "holding", "--limit", "3", "-o", "json"]
        first = await asyncio.to_thread(run_cli, *args, env=env)
        assert first.returncode == 0, first.stderr
        said = re.search(r"more lines: (interlock queues .*)$", first.stderr, re.MULTILINE)
        assert said is not None, first.stderr
        assert said.group(1).startswith("interlock queues --workflow holding --limit 3 --after ")
        token = said.group(1).rsplit(" ", 1)[1]
        second = await asyncio.to_thread(run_cli, *args, "--after", token, env=env)
        assert second.returncode == 0, second.stderr
        assert "more lines" not in second.stderr
        shown = json.loads(first.stdout) + json.loads(second.stdout)
        assert [(q["limit"], q["key"]) for q in shown] == whole
        wrong = await asyncio.to_thread(run_cli, *args, "--after", "nope!", env=env)
        assert wrong.returncode == 2, wrong
        assert "--after: 'nope!' is not a page token" in wrong.stderr, wrong.stderr


def test_a_page_keeps_no_more_than_it_shows_while_reading() -> None:
    """The lines read are kept up to about twice a page (the first ones, in order); a
    line gone since, or of a limit not asked for, or not past ``after``, is not kept."""
    from interlock.client.queues import Kept, page_token, read_page_token
    from interlock.views.queueshape import QueueView

    def line(limit: str, key: str) -> QueueView:
        return QueueView(limit=limit, key=key, running=1, size=1, queued=0)

    keys = [f"k{n:03}" for n in range(200)]
    kept = Kept({"a", "b"}, ("a", "k010"), 3)
    for n, key in enumerate(reversed(keys)):
        kept.offer(f"a.{key}", line("a", key))
        kept.offer(f"x.{key}", line("x", key))  # not asked for
        assert len(kept._lines) <= 2 * (3 + 1), n
    kept.offer("a.k012", None)  # gone since it was read
    assert [v.key for v in kept.lines()] == ["k011", "k013", "k014"]
    assert kept.more()
    assert sorted(kept.firsts) == ["a"]
    assert read_page_token(page_token(("a", "k'\n\u00e9"))) == ("a", "k'\n\u00e9")
    assert read_page_token("x" * 5000) is None
    assert read_page_token("61.62") == ("a", "b")
    for bad in ("abc", "6.62", "61.6", "61-62", "AA.62"):
        assert read_page_token(bad) is None, bad
