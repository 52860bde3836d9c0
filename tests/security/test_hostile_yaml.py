"""Hostile manifests: a "billion laughs" file (under an ignored ``x-`` key), 10,000 levels
of nesting and a 50 MB file get ``path:line:col: yaml-limit: message`` and exit 1, from
``validate`` and from ``apply``, quickly, within a capped address space, and nothing is
applied."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from interlock.runtime.client import InterlockClient
from interlock.transport.subjects import Subjects
from support.hostile import (
    billion_laughs,
    cli_env,
    connect,
    deeply_nested,
    huge_manifest,
    run_capped,
)

BOUND_S = 10.0
"""CPU seconds, far above the ~0.5 s these take; the unbounded loader took minutes (and
gigabytes). CPU time, not wall time: at a load average of 20 to 30 on two cores a command
that takes half a second of CPU can take ten of wall time."""

Maker = Callable[[Path], Path]


def _laughs(tmp: Path) -> Path:
    path = tmp / "laughs.yaml"
    path.write_text(billion_laughs())
    return path


def _deep(tmp: Path) -> Path:
    path = tmp / "deep.yaml"
    path.write_text(deeply_nested(10_000))
    return path


def _huge(tmp: Path) -> Path:
    return huge_manifest(tmp / "huge.yaml")


CASES: dict[str, tuple[Maker, str]] = {
    "billion-laughs": (_laughs, "expands to more than"),
    "nested-10000": (_deep, "nesting deeper than 64 levels"),
    "50MB": (_huge, "at most 524,288 are accepted"),
}


def _check(ran_stderr: str, path: Path, message: str) -> None:
    first = ran_stderr.splitlines()[0]
    assert re.match(rf"^{re.escape(str(path))}:\d+:\d+: yaml-limit: ", first), ran_stderr
    assert message in first
    assert "Traceback" not in ran_stderr


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_validate_refuses_it_at_once(case: str, tmp_path: Path) -> None:
    make, message = CASES[case]
    path = make(tmp_path)
    ran = run_capped("validate", str(path))
    assert ran.code == 1, ran
    _check(ran.stderr, path, message)
    assert ran.cpu < BOUND_S, ran.cpu


def test_validate_refuses_a_huge_manifest_on_stdin(tmp_path: Path) -> None:
    path = _huge(tmp_path)
    ran = run_capped("validate", "-", stdin=path.read_bytes())
    assert ran.code == 1, ran
    assert ran.stderr.startswith("<stdin>:1:1: yaml-limit: the file has more than 524,288 bytes")


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
async def test_apply_refuses_it_and_applies_nothing(
    case: str, tmp_path: Path, nats_url: str, subjects: Subjects
) -> None:
    make, message = CASES[case]
    path = make(tmp_path)
    ran = run_capped("apply", str(path), env=cli_env(nats_url, subjects.prefix))
    assert ran.code == 1, ran
    _check(ran.stderr, path, message)
    assert ran.cpu < BOUND_S, ran.cpu
    nc = await connect(nats_url)
    try:
        client = InterlockClient(nc, subjects)
        await client.registry.load()
        assert await client.registry.workflows() == []
    finally:
        await nc.close()
