"""contracts/ is generated from the code and must not drift from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from interlock.contracts import gen
from interlock.core import events as ev
from support.core import ROOT, Run, compile_one


def test_checked_in_contracts_match_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    code = gen.main(["--check", "--root", str(ROOT)])
    err = capsys.readouterr().err
    assert code == 0, f"contracts/ drifted from the code; run `make contracts`\n{err}"


def test_check_names_every_drifted_and_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gen.main(["--root", str(tmp_path)]) == 0
    capsys.readouterr()
    assert gen.main(["--check", "--root", str(tmp_path)]) == 0
    workflow = tmp_path / "contracts/schemas/workflow.schema.json"
    workflow.write_text(workflow.read_text().replace('"Workflow"', '"Flow"'))
    (tmp_path / "contracts/runlog/catalogue.md").unlink()
    stale = tmp_path / "contracts/runlog/io.interlock.gone.schema.json"
    stale.write_text("{}\n")
    capsys.readouterr()
    assert gen.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "drifted: contracts/schemas/workflow.schema.json" in err
    assert "drifted: contracts/runlog/catalogue.md" in err
    assert "drifted: contracts/runlog/io.interlock.gone.schema.json" in err
    assert "agentdef" not in err


def test_output_is_stable_json_with_a_trailing_newline() -> None:
    first = gen.generate()
    assert first == gen.generate()
    for path, text in first.items():
        assert text.endswith("\n")
        if path.endswith(".json"):
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_every_record_type_has_a_schema_and_a_catalogue_line() -> None:
    generated = gen.generate()
    catalogue = generated["contracts/runlog/catalogue.md"]
    for cls in ev.RECORD_TYPES:
        tag = cls.__struct_config__.tag
        assert f"contracts/runlog/{tag}.schema.json" in generated
        assert f"| `{tag}` |" in catalogue


def test_the_checked_in_schemas_accept_what_the_code_produces(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "contracts", tmp_path / "contracts")
    runlog = tmp_path / "contracts/runlog"
    run = Run(compile_one((ROOT / "examples/code-review.yaml").read_text()))
    run.start({"repository": "a/b", "pr": 1, "score": 9})
    run.answer({"score": 9, "summary": "fine"})
    run.send("approval.granted", {"approver": "bob"})
    run.answer({"message": "merged"})
    assert run.state.status == "completed"
    for record in run.log:
        schema = json.loads((runlog / f"{ev.record_type(record)}.schema.json").read_text())
        jsonschema.validate(json.loads(ev.encode(record)), schema)
    manifest = json.loads((tmp_path / "contracts/schemas/workflow.schema.json").read_text())
    jsonschema.validate(run.definition.manifest, manifest)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**run.definition.manifest, "extra": 1}, manifest)
