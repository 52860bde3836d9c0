"""Typed inputs, triggers with filters, trigger input mappings and derived run ids."""

from __future__ import annotations

from typing import Any

import pytest

from interlock.core.definition import resolve_inputs, type_matches
from interlock.core.engine import (
    Incoming,
    derive_run_id,
    matching_trigger,
    trigger_inputs,
    trigger_matches,
)
from support.core import ROOT, compile_one

INPUTS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: typed}
spec:
  inputs:
    repo: {type: string, required: true}
    pr: {type: integer}
    ratio: {type: number, default: 0.5}
    draft: {type: boolean, default: false}
    labels: {type: "list[string]", default: []}
    meta: {type: object}
    anything: {}
  initial_state: done
  states:
    done: {type: terminal}
"""


@pytest.fixture(scope="module")
def typed() -> Any:
    return compile_one(INPUTS)


def test_defaults_are_applied_and_extra_inputs_kept(typed: Any) -> None:
    resolved, problems = resolve_inputs(typed, {"repo": "a/b", "extra": 1})
    assert problems == []
    assert resolved == {
        "repo": "a/b",
        "extra": 1,
        "ratio": 0.5,
        "draft": False,
        "labels": [],
    }


def test_required_inputs_must_be_given(typed: Any) -> None:
    _, problems = resolve_inputs(typed, {})
    assert problems == ["input 'repo' is required (string)"]


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"pr": "12"}, "input 'pr' must be integer, got string"),
        ({"pr": True}, "input 'pr' must be integer, got boolean"),
        ({"pr": 1.5}, "input 'pr' must be integer, got number"),
        ({"ratio": "high"}, "input 'ratio' must be number, got string"),
        ({"draft": 0}, "input 'draft' must be boolean, got integer"),
        ({"labels": "bug"}, "input 'labels' must be list[string], got string"),
        ({"labels": ["bug", 3]}, "input 'labels' must be list[string], got list"),
        ({"meta": []}, "input 'meta' must be object, got list"),
        ({"repo": None}, "input 'repo' must be string, got null"),
        ({"repo": {"name": "a/b"}}, "input 'repo' must be string, got object"),
    ],
)
def test_wrong_types_are_named(typed: Any, given: dict[str, Any], problem: str) -> None:
    _, problems = resolve_inputs(typed, {"repo": "a/b", **given})
    assert problems == [problem]


def test_right_types_pass(typed: Any) -> None:
    given = {
        "repo": "a/b",
        "pr": 7,
        "ratio": 3,
        "draft": True,
        "labels": ["bug", "ui"],
        "meta": {"k": [1]},
        "anything": None,
    }
    resolved, problems = resolve_inputs(typed, given)
    assert problems == []
    assert resolved == given


@pytest.mark.parametrize(
    ("type_name", "value", "ok"),
    [
        ("list[integer]", [1, 2], True),
        ("list[integer]", [1, True], False),
        ("list[list[string]]", [["a"], []], True),
        ("list[list[string]]", [["a"], [1]], False),
        ("any", True, True),
        ("float", 1, True),
        ("bool", False, True),
        ("map", {}, True),
    ],
)
def test_type_matches(type_name: str, value: Any, ok: bool) -> None:
    assert type_matches(type_name, value) is ok


TRIGGERS = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata: {name: triggered}
spec:
  triggers:
    - event: com.github.pull_request
      filter:
        action: [opened, reopened]
        repository.full_name: zynax-io/zynax
        $source: https://github.com/zynax-io/zynax
        draft: false
    - event: com.example.ticket
      filter:
        $subject: [urgent, critical]
        $type: com.example.ticket
        $tenant: acme
        priority: 1
      input:
        ticket: "{{ data.id }}"
        title: "Ticket {{ data.id }}: {{ data.title }}"
        source: "{{ event.source }}"
    - event: com.example.ping
  initial_state: done
  states:
    done: {type: terminal}
"""


@pytest.fixture(scope="module")
def triggered() -> Any:
    return compile_one(TRIGGERS)


def pr_event(**changes: Any) -> Incoming:
    data: dict[str, Any] = {
        "action": "opened",
        "number": 12,
        "draft": False,
        "repository": {"full_name": "zynax-io/zynax"},
    }
    data.update(changes)
    return Incoming(
        type="com.github.pull_request",
        source="https://github.com/zynax-io/zynax",
        id="delivery-1",
        data=data,
    )


def test_every_filter_entry_must_match(triggered: Any) -> None:
    trigger = triggered.triggers[0]
    assert trigger_matches(trigger, pr_event())
    assert trigger_matches(trigger, pr_event(action="reopened"))  # a list is any of
    assert not trigger_matches(trigger, pr_event(action="closed"))
    assert not trigger_matches(trigger, pr_event(repository={"full_name": "other/repo"}))
    assert not trigger_matches(trigger, pr_event(repository="zynax-io/zynax"))  # no such path
    assert not trigger_matches(trigger, pr_event(draft=0))  # false is not 0
    assert not trigger_matches(trigger, pr_event(draft=None))
    missing = pr_event()
    del missing.data["draft"]
    assert not trigger_matches(trigger, missing)


def test_attribute_filters_and_event_type(triggered: Any) -> None:
    trigger = triggered.triggers[0]
    elsewhere = Incoming(type=pr_event().type, source="https://github.com/fork/x", id="1")
    assert not trigger_matches(trigger, elsewhere)
    wrong_type = Incoming(type="com.github.push", source=pr_event().source, id="1")
    assert not trigger_matches(trigger, wrong_type)


def ticket(subject: str | None = "urgent", tenant: str | None = "acme", **data: Any) -> Incoming:
    extensions = {} if tenant is None else {"tenant": tenant}
    return Incoming(
        type="com.example.ticket",
        source="urn:tickets",
        id="t-1",
        subject=subject,
        extensions=extensions,
        data={"id": 77, "title": "Disk full", "priority": 1, **data},
    )


def test_subject_type_and_extension_attributes(triggered: Any) -> None:
    trigger = triggered.triggers[1]
    assert trigger_matches(trigger, ticket())
    assert trigger_matches(trigger, ticket(subject="critical"))
    assert not trigger_matches(trigger, ticket(subject="low"))
    assert not trigger_matches(trigger, ticket(subject=None))
    assert not trigger_matches(trigger, ticket(tenant="other"))
    assert not trigger_matches(trigger, ticket(tenant=None))
    assert not trigger_matches(trigger, ticket(priority=2))
    assert trigger_matches(trigger, ticket(priority=1.0))  # numbers compare by value


def test_the_first_matching_trigger_is_taken(triggered: Any) -> None:
    assert matching_trigger(triggered, pr_event()) is triggered.triggers[0]
    assert matching_trigger(triggered, ticket()) is triggered.triggers[1]
    ping = Incoming(type="com.example.ping", source="s", id="1")
    assert matching_trigger(triggered, ping) is triggered.triggers[2]  # no filter: any
    assert matching_trigger(triggered, Incoming(type="nothing", source="s", id="1")) is None


def test_without_an_input_mapping_the_data_are_the_inputs(triggered: Any) -> None:
    event = pr_event()
    assert trigger_inputs(triggered.triggers[0], event) == event.data
    assert trigger_inputs(triggered.triggers[2], Incoming(type="t", source="s", id="1")) == {}
    listed = Incoming(type="t", source="s", id="1", data=[1, 2])
    assert trigger_inputs(triggered.triggers[2], listed) == {}


def test_an_input_mapping_builds_the_inputs(triggered: Any) -> None:
    assert trigger_inputs(triggered.triggers[1], ticket()) == {
        "ticket": 77,
        "title": "Ticket 77: Disk full",
        "source": "urn:tickets",
    }


def test_the_example_trigger_gives_valid_inputs() -> None:
    definition = compile_one((ROOT / "examples/code-review.yaml").read_text())
    event = pr_event(diff="+ one\n+ two\n")
    trigger = matching_trigger(definition, event)
    assert trigger is not None
    inputs, problems = resolve_inputs(definition, trigger_inputs(trigger, event))
    assert problems == []
    assert inputs == {
        "repository": "zynax-io/zynax",
        "pr": 12,
        "diff": "+ one\n+ two\n",
        "score": 6,
        "approvers": ["alice", "bob"],
    }
    no_diff = trigger_inputs(trigger, pr_event())
    assert no_diff["diff"] == ""


def test_derive_run_id_is_stable(triggered: Any) -> None:
    run_id = derive_run_id(triggered, "https://github.com/zynax-io/zynax", "delivery-1")
    # Pinned: the same event must never start a second run, across versions too.
    assert run_id == "r639d11fcf207d3517f03b893"
    assert derive_run_id(triggered, "https://github.com/zynax-io/zynax", "delivery-1") == run_id
    assert derive_run_id(triggered, "https://github.com/zynax-io/zynax", "delivery-2") != run_id
    assert derive_run_id(triggered, "https://github.com/other", "delivery-1") != run_id
    other = compile_one(TRIGGERS.replace("name: triggered", "name: triggered-two"))
    assert derive_run_id(other, "https://github.com/zynax-io/zynax", "delivery-1") != run_id
    elsewhere = compile_one(TRIGGERS.replace("name: triggered", "name: triggered, namespace: x"))
    assert derive_run_id(elsewhere, "https://github.com/zynax-io/zynax", "delivery-1") != run_id
    assert len(run_id) == 25
    assert run_id.isalnum()


def test_a_path_or_attribute_the_event_lacks_does_not_match_even_null() -> None:
    """Documented: a path that does not exist does not match, nor an attribute the event
    does not carry, and ``$data`` is no attribute; so a filter on ``null`` matches only a
    value that is there and null."""
    definition = compile_one(
        TRIGGERS.replace(
            """    - event: com.example.ping
""",
            """    - event: com.example.ping
      filter: {closed_at: null}
    - event: com.example.ping
      filter: {$subject: null}
    - event: com.example.ping
      filter: {$data.priority: 1}
    - event: com.example.ping
      filter: {$subject.x: "42"}
""",
        )
    )
    null_path, null_attribute, dollar_data, into_text = definition.triggers[2:6]

    def ping(data: Any) -> Incoming:
        return Incoming(type="com.example.ping", source="s", id="1", data=data)

    assert trigger_matches(null_path, ping({"closed_at": None}))
    assert not trigger_matches(null_path, ping({}))
    assert not trigger_matches(null_path, ping({"closed_at": 0}))
    assert not trigger_matches(null_attribute, ping({}))  # the event has no subject
    assert not trigger_matches(dollar_data, ping({"priority": 1}))
    # An attribute is text: a path into it finds nothing.
    subject = Incoming(type="com.example.ping", source="s", id="1", subject="42")
    assert not trigger_matches(into_text, subject)
