"""Run ids and event types: what may become a NATS subject token, and what the error says
when something may not (the CLI, the client and the gateway print it as it is)."""

from __future__ import annotations

import pytest

from interlock.core.ids import (
    EVENT_TYPE_MAX,
    RUN_ID_MAX,
    InvalidEventType,
    InvalidRunId,
    check_event_type,
    check_run_id,
    is_run_id,
)

RUN_ID_RULE = "letters, digits, '_' and '-', 1 to 128 characters"


@pytest.mark.parametrize("good", ["r", "run-1", "A_b-9", "x" * RUN_ID_MAX])
def test_a_run_id_is_one_token_of_letters_digits_underscore_and_dash(good: str) -> None:
    assert is_run_id(good)
    assert check_run_id(good) == good


@pytest.mark.parametrize(
    "bad",
    ["", "a.b", "a b", "*", ">", "bad.id.>", "r\n", "é", "x" * (RUN_ID_MAX + 1), None, 7, b"r"],
)
def test_anything_else_is_refused(bad: object) -> None:
    assert not is_run_id(bad)
    with pytest.raises(InvalidRunId) as caught:
        check_run_id(bad)
    assert isinstance(caught.value, ValueError)
    shown = repr(bad[:80]) if isinstance(bad, str) else repr(bad)
    assert str(caught.value) == f"invalid run id {shown}: a run id is {RUN_ID_RULE}"


def test_a_long_refused_value_is_shown_cut_at_80_characters() -> None:
    exact = "." * 80
    assert str(InvalidRunId(exact)) == f"invalid run id {exact!r}: a run id is {RUN_ID_RULE}"
    longer = "." * 79 + "ab"
    assert str(InvalidRunId(longer)) == f"invalid run id {longer[:80]!r}: a run id is {RUN_ID_RULE}"
    many = ["x"] * 200  # not text: shown whole, whatever its length
    assert str(InvalidRunId(many)).startswith(f"invalid run id {many!r}:")


@pytest.mark.parametrize(
    "good", ["order.created", "a", "com.example.x-y_z", "A.B.C", "x" * EVENT_TYPE_MAX]
)
def test_an_event_type_is_dot_separated_words(good: str) -> None:
    assert check_event_type(good) == good


@pytest.mark.parametrize(
    "bad",
    ["", ".", "a.", ".a", "a..b", "a.*", "a.>", "a b", "x" * (EVENT_TYPE_MAX + 1), None, 3],
)
def test_other_event_types_are_refused_with_the_rule(bad: object) -> None:
    with pytest.raises(InvalidEventType) as caught:
        check_event_type(bad)
    assert isinstance(caught.value, ValueError)
    rule = "dot-separated words of letters, digits, '_' and '-', at most 255 characters"
    shown = repr(bad[:80]) if isinstance(bad, str) else repr(bad)
    assert str(caught.value) == f"invalid event type {shown}: an event type is {rule}"


def test_a_long_refused_event_type_is_shown_cut_at_80_characters() -> None:
    exact = "*" * 80
    assert str(InvalidEventType(exact)).startswith(f"invalid event type {exact!r}:")
    longer = "*" * 79 + "ab"
    assert str(InvalidEventType(longer)).startswith(f"invalid event type {longer[:80]!r}:")
    assert str(InvalidEventType(None)).startswith("invalid event type None:")
