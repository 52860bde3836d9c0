"""The roles' permissions follow the wire layout (docs/architecture.md, "Trust boundary")."""

from __future__ import annotations

import pytest

from interlock.auth.roles import agent, publisher, templates, validate_event_pattern
from interlock.transport.subjects import Subjects


def test_templates_follow_the_layout() -> None:
    roles = templates(Subjects("il"))
    agent_pub = set(roles["agent"].pub_allow)
    assert {
        "il.js.API.CONSUMER.MSG.NEXT.IL_TASKS.cap_{capability_token}",
        "$JS.ACK.IL_TASKS.cap_{capability_token}.>",
        "il.results.{capability}.*",
        "il.answer.{capability}.*",
        "il.dlq.agent.{capability}.*",
        "$KV.il_workers.{capability_token}.*",
    } <= agent_pub
    # Its JetStream API is its account's imports, under the agents' API prefix.
    assert not [s for s in agent_pub if s.startswith("$JS.API")]
    # Agents never manage the tasks stream or its consumers, nor touch logs and timers.
    assert not [s for s in agent_pub if "IL_TASKS" in s and ("CREATE" in s or "DELETE" in s)]
    assert not [
        s for s in agent_pub if s.startswith(("il.runs", "il.timers", "il.cap", "il.events"))
    ]
    assert set(roles["agent"].sub_allow) == {
        "_INBOX.{user}.>",
        "il.control.{capability}.*",
        "$KV.il_agents.>",  # hearing AgentDef writes, which it may read anyway
    }
    # No consumer of any kind: the consumers it uses are the orchestrator's durables.
    assert not [s for s in agent_pub if "CONSUMER.CREATE" in s or "$JS.FC" in s]
    # Its own object bucket: the chunks and meta of its uploads, and the meta read of a put.
    assert roles["publisher"].pub_allow == (
        "il.events.{events}",
        "$O.{bucket}.C.*",
        "$O.{bucket}.M.*",
        "il.js.API.STREAM.MSG.GET.OBJ_{bucket}",
        "il.js.API.STREAM.INFO.OBJ_{bucket}",
    )
    # An agent reads its capabilities' task inputs by direct gets, and writes its own bucket.
    assert {
        "il.js.API.DIRECT.GET.OBJ_il_in_{capability_token}",
        "$O.{bucket}.C.*",
        "$O.{bucket}.M.*",
    } <= agent_pub
    assert roles["publisher"].pub_deny == ("il.events.@run.>",)
    assert roles["publisher"].sub_allow == ("_INBOX.{user}.>",)
    gateway = roles["gateway"]
    assert {"il.events.>", "il.runs.>"} <= set(gateway.pub_allow)
    # Its account imports the JetStream API under the prefix: nothing under $JS.API.
    assert not [s for s in gateway.pub_allow if s.startswith("$JS.API")]
    # The queue depth GET /agents reports is read from the task consumers' info: read-only.
    assert "il.js.API.CONSUMER.INFO.IL_TASKS.*" in gateway.pub_allow
    # It writes run logs: it reads the log key (one subject's direct get) and may make it.
    assert {
        "il.js.API.DIRECT.GET.KV_il_secrets.$KV.il_secrets.shared.log-key",
        "$KV.il_secrets.shared.log-key",
    } <= set(gateway.pub_allow)
    # No stream administration, no consumer, nothing of the orchestrator's own.
    assert not [
        s
        for s in gateway.pub_allow
        if (
            s != "$KV.il_secrets.shared.log-key"
            and s.startswith(
                ("il.cap", "il.results", "il.answer", "il.timers", "il.dlq", "$KV.il_secrets")
            )
        )
        or any(op in s for op in ("STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "PURGE"))
        or "DURABLE" in s
        or ("CONSUMER" in s and s != "il.js.API.CONSUMER.INFO.IL_TASKS.*")
    ]
    # The run index's writes and the run logs come as imported streams: no consumer.
    assert set(gateway.sub_allow) == {"_INBOX.{user}.>", "il.runs.>", "$KV.il_runs.*"}
    # The secrets' one-word keys (the task-token key) are the orchestrator's alone.
    assert "$KV.il_secrets.*" in gateway.pub_deny
    assert "il.js.API.DIRECT.GET.KV_il_secrets.$KV.il_secrets.*" in gateway.pub_deny
    operator = roles["operator"]
    assert {"il.timers.>", "il.cap.>", "il.results.>", "$KV.il_secrets.*"} <= set(operator.pub_deny)
    assert "$JS.API.>" in operator.pub_allow


def test_a_capability_with_dots_reaches_only_its_own_answers() -> None:
    perms = agent(Subjects("il"), "UKEY", ["review.deep"])
    assert "il.results.review.deep.*" in perms.pub_allow
    assert "il.answer.review.deep.*" in perms.pub_allow
    assert "il.js.API.CONSUMER.MSG.NEXT.IL_TASKS.cap_review_deep" in perms.pub_allow


@pytest.mark.parametrize("bad", ["", "a..b", "a.>.b", "a b", "a.b*", ">x"])
def test_bad_event_patterns_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="event type pattern"):
        validate_event_pattern(bad)
    with pytest.raises(ValueError):
        publisher(Subjects("il"), "UKEY", [bad])


@pytest.mark.parametrize("bad", [[], ["a.>"], ["a b"], [""]])
def test_bad_capabilities_are_refused(bad: list[str]) -> None:
    with pytest.raises(ValueError):
        agent(Subjects("il"), "UKEY", bad)
