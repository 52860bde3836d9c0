"""Our NATS binding against the CloudEvents SDK: what one encodes, the other reads."""

from __future__ import annotations

import json

import pytest

from interlock.transport.cloudevents import CloudEvent, decode_message, encode_structured

sdk_json = pytest.importorskip("cloudevents.core.formats.json")
sdk_event = pytest.importorskip("cloudevents.core.v1.event")


def test_sdk_structured_event_decodes_here() -> None:
    event = sdk_event.CloudEvent(
        attributes={
            "id": "e-1",
            "source": "https://example.com/repo",
            "type": "com.example.pr.opened",
            "datacontenttype": "application/json",
            "runid": "r123",
        },
        data={"repository": "example/repo", "score": 9},
    )
    payload = sdk_json.JSONFormat().write(event)
    got = decode_message({"Content-Type": "application/cloudevents+json"}, payload)
    assert got.id == "e-1"
    assert got.type == "com.example.pr.opened"
    assert got.data == {"repository": "example/repo", "score": 9}
    assert got.extensions == {"runid": "r123"}


def test_our_structured_event_reads_in_the_sdk() -> None:
    ours = CloudEvent(
        id="e-2",
        source="interlock://test",
        type="review.approved",
        datacontenttype="application/json",
        data={"score": 9},
        extensions={"actionid": "r1:3"},
    )
    _, payload = encode_structured(ours)
    theirs = sdk_json.JSONFormat().read(None, payload)
    attributes = theirs.get_attributes()
    assert attributes["id"] == "e-2"
    assert attributes["type"] == "review.approved"
    assert attributes["actionid"] == "r1:3"
    data = theirs.get_data()
    assert (json.loads(data) if isinstance(data, bytes | str) else data) == {"score": 9}
