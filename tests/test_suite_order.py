"""The modules tests/conftest.py starts first exist, so a renamed or removed one is noticed
(it would no longer be started first, and the suite's two processes would drift apart)."""

from __future__ import annotations

from pathlib import Path

from support.suite_order import LONGEST_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_each_module_started_first_exists_once() -> None:
    missing = [path for path in LONGEST_FIRST if not (ROOT / path).is_file()]
    assert not missing, f"support/suite_order.py LONGEST_FIRST names no such module: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST), LONGEST_FIRST
