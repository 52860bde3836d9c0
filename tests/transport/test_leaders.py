"""Which partition leaders are asked to hand over: only those that are not spread."""

from __future__ import annotations

from collections import Counter

import pytest

from interlock.transport.leaders import Led, moves

NODES = ("n1", "n2", "n3")


def _streams(*leaders: str, peers: tuple[str, ...] = NODES) -> list[Led]:
    return [Led(p, leader, peers) for p, leader in enumerate(leaders)]


def _after(streams: list[Led]) -> Counter[str]:
    led = {s.partition: s.leader for s in streams}
    led.update(moves(streams))
    return Counter(led.values())


@pytest.mark.parametrize(
    "leaders",
    [
        ("n1", "n2", "n3", "n1", "n2", "n3"),
        ("n3", "n3", "n1", "n1", "n2", "n2"),  # spread, not by turn: left alone
        ("n2", "n1"),
        ("n1",),
    ],
)
def test_spread_leaders_are_never_asked(leaders: tuple[str, ...]) -> None:
    assert moves(_streams(*leaders)) == []


def test_two_on_one_node_while_another_leads_none_moves_one_to_that_node() -> None:
    assert moves(_streams("n1", "n1")) == [(1, "n2")]  # partition 1's turn is n2
    assert moves(_streams("n1", "n1", "n2")) == [(0, "n3")]  # n3 leads none


def test_all_on_one_node_moves_the_fewest_to_spread_them() -> None:
    streams = _streams(*["n1"] * 6)
    planned = moves(streams)
    assert len(planned) == 4
    assert _after(streams) == Counter({"n1": 2, "n2": 2, "n3": 2})
    # each to the node whose turn it is, where the counts allow it
    assert planned == [(1, "n2"), (2, "n3"), (4, "n2"), (5, "n3")]


def test_three_two_one_moves_one() -> None:
    streams = _streams("n1", "n2", "n3", "n1", "n2", "n1")
    assert moves(streams) == [(5, "n3")]


def test_only_to_a_peer_of_the_stream_and_never_a_leaderless_or_single_stream() -> None:
    streams = [
        Led(0, "n1", ("n1", "n2", "n3")),
        Led(1, "n1", ("n1", "n2", "n3")),
        Led(2, "n1", ("n1", "n4", "n5")),
        Led(3, "", ("n1", "n2", "n3")),  # electing: left
        Led(4, "n1", ("n1",)),  # R1: cannot move
        Led(5, "n1", ("n1",)),
    ]
    planned = moves(streams)
    assert planned == [(0, "n3"), (1, "n2"), (2, "n5")]
    assert all(node in streams[p].peers for p, node in planned)
