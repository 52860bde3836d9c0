"""docs/agents-any-language.md says what is on the wire: its header tables list every
header the orchestrator puts on a task and on a cancel notice, it states the cancel rule
as the contract does, and it says how an agent dead-letters a task."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from interlock.transport import tasks

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "agents-any-language.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end > 0 else None]


def table_headers(text: str) -> set[str]:
    """The header names in the first column of the tables of ``text``."""
    names: set[str] = set()
    for row in re.findall(r"^\| (`[^|]*`) \|", text, re.MULTILINE):
        names.update(re.findall(r"`([^`]+)`", row))
    return names


def test_the_task_table_lists_every_header_of_a_task() -> None:
    headers, _ = tasks.encode_request(
        run_id="r1",
        action_id="r1:3",
        capability="demo.greet",
        attempt=2,
        data={},
        time="2026-01-01T12:00:00.000Z",
        deadline="2026-01-01T12:05:00.000Z",
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        token="q3N0",
    )
    missing = set(headers) - table_headers(section("Step 4: read a task"))
    assert not missing, f"the task header table leaves out {sorted(missing)}"


def test_the_cancel_table_lists_every_header_of_a_notice() -> None:
    for attempt in (None, 2):
        headers, payload = tasks.encode_cancel(
            run_id="r1", action_id="r1:3", time="2026-01-01T12:00:00.000Z", attempt=attempt
        )
        assert payload == b""
        missing = set(headers) - table_headers(section("Step 7: honour cancel notices"))
        assert not missing, f"the cancel notice table leaves out {sorted(missing)}"


def test_the_cancel_rule_is_the_contracts() -> None:
    contract = yaml.safe_load((ROOT / "contracts" / "asyncapi.yaml").read_text())
    said = contract["components"]["messages"]["CancelNotice"]["description"]
    rule = "attempt 1, and every other attempt whose task's ce-time is before the notice's ce-time"
    assert rule in said
    step = " ".join(section("Step 7: honour cancel notices").split())
    assert rule.replace("ce-time", "`ce-time`") in step


def test_an_agents_dead_letter_is_spelled_out() -> None:
    step = " ".join(section("Step 4: read a task").split())
    assert "publish it with JetStream" in step
    for header in (
        "Interlock-Dead-Letter-Reason",
        "Interlock-Dead-Letter-Detail",
        "Interlock-Dead-Letter-Subject",
        "Interlock-Dead-Letter-Worker",
        "Nats-Msg-Id",
    ):
        assert f"`{header}" in step
    for reason in ("no-run-id", "missing-attribute", "bad-specversion", "bad-json"):
        assert f"`{reason}`" in step


def test_the_calls_an_agent_credential_may_not_make_are_named() -> None:
    allowed = " ".join(section("What your credential allows").split())
    for call in ("jetstreamManager()", "js.views.kv(", "$JS.API.INFO", "js.consumers.get("):
        assert call in allowed
