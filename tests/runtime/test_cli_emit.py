"""`interlock emit` says what the event did, as a user reads it: the runs it started, the
run it reached by correlation, the workflows that dead-lettered it and why, or nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from support.runtime import HELLO, Installation, cli_installation, yaml

ORDERS = yaml(
    """\
    apiVersion: interlock.io/v1
    kind: Workflow
    metadata:
      name: orders
    spec:
      inputs:
        order: {type: string, required: true}
      triggers:
        - event: com.example.order.placed
          input: {order: "{{ data.order.id }}"}
      correlate:
        key: "{{ inputs.order }}"
        events:
          com.example.order.shipped: data.order_id
      initial_state: packing
      states:
        packing:
          type: human_in_the_loop
          on:
            - {event: com.example.order.shipped, goto: done}
        done:
          type: terminal
    """
)


@pytest.fixture(scope="module")
def inst(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    files = tmp_path_factory.mktemp("emit")
    manifests = {"hello.yaml": HELLO, "orders.yaml": ORDERS}
    with cli_installation(nats_url, files, manifests, tag="emit") as base:
        base.ok("apply", "echo.yaml", "hello.yaml", "orders.yaml")
        yield base


def lines(inst: Installation, *args: str) -> list[str]:
    return inst.ok("emit", *args).splitlines()


def test_a_trigger_whose_input_cannot_be_rendered(inst: Installation) -> None:
    out = lines(inst, "com.example.order.placed", "--source", "/t", "--id", "p1", "--data", "{}")
    assert out[0] == "emitted com.example.order.placed id=p1"
    assert out[1].startswith("dead-lettered (bad-trigger-input) by default/orders: orders: ")
    assert len(out) == 2


def test_inputs_the_workflow_refuses(inst: Installation) -> None:
    out = lines(
        inst, "com.example.greet", "--source", "/t", "--id", "g1", "--data", '{"lang": "en"}'
    )
    assert out == [
        "emitted com.example.greet id=g1",
        "dead-lettered (invalid-inputs) by default/hello: input 'message' is required (string)",
    ]
    as_json = json.loads(
        inst.ok(
            "emit",
            "com.example.greet",
            "--source",
            "/t",
            "--id",
            "g2",
            "--data",
            '{"lang": "en"}',
            "-o",
            "json",
        )
    )
    assert as_json["started"] == []
    assert as_json["refused"] == [
        {
            "workflow": "hello",
            "namespace": "default",
            "reason": "invalid-inputs",
            "detail": "input 'message' is required (string)",
        }
    ]


def test_an_event_reaching_a_run_by_its_correlation_key(inst: Installation) -> None:
    placed = json.dumps({"order": {"id": "o-7"}})
    started = json.loads(
        inst.ok(
            "emit",
            "com.example.order.placed",
            "--source",
            "/t",
            "--id",
            "p7",
            "--data",
            placed,
            "-o",
            "json",
        )
    )
    (run,) = started["started"]
    shipped = json.dumps({"order_id": "o-7"})
    out = lines(
        inst, "com.example.order.shipped", "--source", "/t", "--id", "s7", "--data", shipped
    )
    assert out == [
        "emitted com.example.order.shipped id=s7",
        f"reached  {run['run_id']}  (waiting for it by its correlation key)",
    ]
    done = inst.cli("result", run["run_id"], "--wait", "--timeout", "20")
    assert done.returncode == 0, done.stderr


def test_an_event_kept_for_a_run_not_started_yet(inst: Installation) -> None:
    shipped = json.dumps({"order_id": "o-none"})
    out = lines(
        inst, "com.example.order.shipped", "--source", "/t", "--id", "s0", "--data", shipped
    )
    assert out == [
        "emitted com.example.order.shipped id=s0",
        "kept for default/orders: no run of its correlation key yet (kept 15 minutes)",
    ]


def test_an_event_nothing_takes(inst: Installation) -> None:
    out = lines(inst, "com.example.nobody", "--source", "/t", "--id", "n1")
    assert out == [
        "emitted com.example.nobody id=n1",
        "nothing: no trigger or correlation takes com.example.nobody",
    ]


def test_the_readme_event_starts_a_run_of_the_workflow_init_writes(inst: Installation) -> None:
    """README: `interlock init workflow hello`, applied, then the event it posts."""
    inst.ok("init", "workflow", "hello-init", "-o", "hello-init.yaml")
    inst.ok("apply", "hello-init.yaml")
    out = lines(
        inst, "com.example.greet", "--source", "/readme", "--id", "1", "--data", '{"message": "hi"}'
    )
    assert len(out) == 2, out
    assert out[1].startswith("started  r"), out
    assert out[1].endswith("  default/hello-init v1"), out
    run_id = out[1].split()[1]
    done = inst.cli("result", run_id, "--wait", "--timeout", "20")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["echoed"] == "hi"
