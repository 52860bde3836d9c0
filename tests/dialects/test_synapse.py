"""synapse workflow artifacts load as written: synapse's rules, `compile` and `plan` as the
seed shows them, and conversion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlock.dialects import prepare
from interlock.dialects.synapse import parse, plan
from support.dialects import FIXTURES, converted_matches, errors_of, run_cli

EXAMPLES = sorted(FIXTURES.glob("synapse-*.json"))
RELEASE = FIXTURES / "synapse-release.json"


def workflow(path: Path):  # type: ignore[no-untyped-def]
    documents = prepare([(str(path), path.read_text())]).lowered
    return documents[0].extra["workflow"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_validates_and_converts(path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _out, err = run_cli(["validate", str(path)], capsys)
    assert code == 0, err
    converted_matches(path, capsys)


def test_compile_prints_the_seeds_summaries(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run_cli(["compile", str(RELEASE)], capsys)
    assert code == 0
    assert out == (
        "3 blackboard tasks:\n"
        "  release/build [ci] <- (none)\n"
        "  release/test <- release/build\n"
        "  release/publish [release] <- release/test\n"
    )
    code, out, _ = run_cli(["compile", str(FIXTURES / "synapse-release-branch.json")], capsys)
    assert "  release/deploy <- release/test:done\n" in out
    assert "  release/rollback <- release/test:cancelled\n" in out
    code, out, _ = run_cli(["compile", str(FIXTURES / "synapse-ingest.json")], capsys)
    assert out == (
        "4 blackboard tasks:\n"
        "  ingest/shard#us <- (none)\n"
        "  ingest/shard#eu <- (none)\n"
        "  ingest/shard#apac <- (none)\n"
        "  ingest/merge <- ingest/shard#us, ingest/shard#eu, ingest/shard#apac\n"
    )


def test_compile_json_declares_the_tasks(capsys) -> None:  # type: ignore[no-untyped-def]
    _code, out, _ = run_cli(["compile", str(FIXTURES / "synapse-ingest.json"), "--json"], capsys)
    tasks = json.loads(out)
    assert tasks[0] == {"id": "ingest/shard#us", "title": "Ingest shard [us]", "depends_on": []}
    assert tasks[3]["depends_on"] == ["ingest/shard#us", "ingest/shard#eu", "ingest/shard#apac"]


def test_plan_routes_ready_tasks_to_capable_free_agents(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "status.json").write_text('{"release/build": "done"}')
    (tmp_path / "agents.json").write_text('{"alice": ["ci"], "bob": []}')
    argv = ["plan", str(RELEASE), "--status", str(tmp_path / "status.json")]
    argv += ["--agents", str(tmp_path / "agents.json"), "--max-in-flight", "4"]
    code, out, _ = run_cli(argv, capsys)
    assert code == 0
    assert out == (
        "state: 1 done, 0 in flight, 1 ready, 1 blocked\nassignments:\n  release/test -> alice\n"
    )
    code, out, _ = run_cli([*argv, "--json"], capsys)
    assert json.loads(out)["assignments"] == [{"task": "release/test", "agent": "alice"}]


def test_plan_is_pure_over_status_evidence_and_agents() -> None:
    wf = workflow(FIXTURES / "synapse-release-evidence.json")
    # publish waits for its evidence, then for every predicate.
    held = plan(wf, {"release/test": "done"}, {}, {"a": []})
    assert (held.ready, held.blocked) == ([], ["release/publish"])
    partial = {"release/publish": {"receipt": "verified", "policy": "pass"}}
    assert plan(wf, {"release/test": "done"}, partial, {"a": []}).ready == []
    proof = json.loads((FIXTURES.parent / "synapse-evidence.json").read_text())
    ready = plan(wf, {"release/test": "done"}, proof, {"a": []})
    assert ready.assignments == [("release/publish", "a")]
    # Conditional edges: the branch that can never fire is skipped.
    branch = workflow(FIXTURES / "synapse-release-branch.json")
    result = plan(branch, {"release/test": "done"}, {}, {"a": [], "b": []})
    assert result.ready == ["release/deploy"]
    assert result.skipped == ["release/rollback"]
    # In flight counts against the budget; one task per agent.
    ingest = workflow(FIXTURES / "synapse-ingest.json")
    busy = plan(ingest, {"ingest/shard#us": "claimed"}, {}, {"a": [], "b": [], "c": []}, 2)
    assert busy.in_flight == ["ingest/shard#us"]
    assert busy.assignments == [("ingest/shard#eu", "a")]


def test_plan_refuses_bad_files_with_exit_2(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "bad.json").write_text("[1]")
    code, _, err = run_cli(["plan", str(RELEASE), "--agents", str(tmp_path / "bad.json")], capsys)
    assert code == 2
    assert "must be a JSON dict" in err
    (tmp_path / "cycle.json").write_text(
        '{"name": "c", "steps": [{"id": "a", "title": "A", "depends_on": ["a"]}]}'
    )
    code, _, err = run_cli(["plan", str(tmp_path / "cycle.json")], capsys)
    assert code == 2
    assert "synapse.self-dependency" in err


def test_lowering_is_one_dag_each_task_a_step_with_its_edges() -> None:
    ingest = prepare([("i.json", (FIXTURES / "synapse-ingest.json").read_text())])
    spec = ingest.documents[0].data["spec"]
    assert spec["initial_state"] == "run"
    dag = spec["states"]["run"]["dag"]
    assert dag["completion"] == "all_settled"
    assert list(dag["steps"]) == ["shard-us", "shard-eu", "shard-apac", "merge"]
    assert [s["action"]["input"]["task"] for s in dag["steps"].values()] == [
        "ingest/shard#us",
        "ingest/shard#eu",
        "ingest/shard#apac",
        "ingest/merge",
    ]
    # A plain edge is satisfied by any end of the task it waits for.
    assert dag["steps"]["merge"]["depends_on"] == [
        {"step": f"shard-{r}", "on": "ended"} for r in ("us", "eu", "apac")
    ]
    text = json.dumps(
        {
            "name": "diamond",
            "steps": [
                {"id": "a", "title": "A"},
                {"id": "b", "title": "B", "depends_on": [{"step": "a", "on": "done"}]},
                {"id": "c", "title": "C", "depends_on": [{"step": "a", "on": "cancelled"}]},
                {"id": "d", "title": "D", "depends_on": ["b", "c"], "task_class": "x"},
            ],
        }
    )
    states = prepare([("d.json", text)]).documents[0].data["spec"]["states"]
    assert list(states) == ["run", "complete", "timed_out"]
    steps = states["run"]["dag"]["steps"]
    assert steps["b"]["depends_on"] == ["a"]
    assert steps["c"]["depends_on"] == [{"step": "a", "on": ["failed", "skipped"]}]
    assert steps["d"]["action"]["capability"] == "x"


BROKEN = [
    (
        "duplicate id",
        [{"id": "a", "title": "A"}, {"id": "a", "title": "B"}],
        "synapse.duplicate-step",
    ),
    ("self", [{"id": "a", "title": "A", "depends_on": ["a"]}], "synapse.self-dependency"),
    ("unknown", [{"id": "a", "title": "A", "depends_on": ["z"]}], "synapse.unknown-dependency"),
    (
        "cycle",
        [
            {"id": "a", "title": "A", "depends_on": ["b"]},
            {"id": "b", "title": "B", "depends_on": ["a"]},
        ],
        "synapse.cycle",
    ),
    ("fan-out", [{"id": "a", "title": "A", "for_each": list(range(65))}], "synapse.fan-out"),
    (
        "predicate",
        [{"id": "a", "title": "A", "requires": {"vibes": "good"}}],
        "synapse.unknown-predicate",
    ),
    (
        "condition",
        [
            {"id": "a", "title": "A"},
            {"id": "b", "title": "B", "depends_on": [{"step": "a", "on": "failed"}]},
        ],
        "synapse.invalid-value",
    ),
    ("no title", [{"id": "a"}], "synapse.missing-field"),
]


@pytest.mark.parametrize(("what", "steps", "rule"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_rule_refuses_a_file_that_breaks_it(what: str, steps: list, rule: str) -> None:
    text = json.dumps({"name": "w", "steps": steps}, indent=2)
    errors = errors_of("w.json", text)
    assert len(errors) == 1, errors
    assert f": {rule}: " in errors[0], errors
    # The position is in the JSON file: the line of the offending step.
    line = int(errors[0].split(":")[1])
    assert 3 <= line <= len(text.splitlines())


def test_a_json_syntax_error_has_its_position() -> None:
    assert errors_of("w.json", '{"name": "w",\n "steps": [}\n') == [
        "w.json:2:12: json-syntax: expected a value, got '}'"
    ]


def test_cycle_names_a_step_on_it() -> None:
    text = json.dumps(
        {
            "name": "w",
            "steps": [
                {"id": "a", "title": "A"},
                {"id": "b", "title": "B", "depends_on": ["c"]},
                {"id": "c", "title": "C", "depends_on": ["b"]},
            ],
        }
    )
    errors = errors_of("w.json", text)
    assert "cycle through step 'b'" in errors[0] or "cycle through step 'c'" in errors[0]
    assert parse  # the parser is what `plan` and `compile` use
