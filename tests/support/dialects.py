"""Shared by the dialect tests: the seed examples stored as fixtures, and helpers that run
the CLI in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from interlock.cli.main import main as interlock_main
from interlock.core.compiler import compile_sources
from interlock.dialects import prepare

FIXTURES = Path(__file__).resolve().parents[1] / "dialects" / "fixtures"


def errors_of(path: str, text: str, dialect: str | None = None) -> list[str]:
    """Every diagnostic for one file, as ``path:line:col: rule: message`` (dialect rules and
    the native compiler's)."""
    prepared = prepare([(path, text)], dialect)
    compiled = compile_sources(prepared.sources, documents=[*prepared.documents, *prepared.agents])
    return [str(d) for d in sorted([*prepared.diagnostics, *compiled.diagnostics])]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = interlock_main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def converted_matches(path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict]:
    """``interlock convert FILE``: its output validates and reads back to exactly the
    lowered documents; returns them."""
    code, out, err = run_cli(["convert", str(path)], capsys)
    assert code == 0, err
    documents = [d for d in yaml.safe_load_all(out) if d is not None]
    prepared = prepare([(str(path), path.read_text())])
    assert documents == [d.data for d in [*prepared.documents, *prepared.agents]]
    compiled = compile_sources([("converted.yaml", out)])
    assert compiled.ok, compiled.diagnostics
    return documents
