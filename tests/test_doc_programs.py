"""The Python in the docs is programs a reader can run: each block compiles as a module
and uses no name it does not define or import (docs/client.md's blocks are also run, by
tests/runtime/test_client_docs.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
RUFF = str(Path(sys.executable).with_name("ruff"))


def blocks() -> list[tuple[str, int, str]]:
    out = []
    for doc in ("debugging.md", "client.md"):
        text = (DOCS / doc).read_text(encoding="utf-8")
        for n, found in enumerate(re.finditer(r"```python\n(.*?)```", text, re.DOTALL)):
            out.append((doc, n, found[1]))
    return out


@pytest.mark.parametrize(("doc", "n", "code"), blocks(), ids=lambda v: str(v)[:16])
def test_a_python_block_is_a_program(doc: str, n: int, code: str, tmp_path: Path) -> None:
    compile(code, f"{doc} block {n}", "exec")  # no `await` outside a function
    path = tmp_path / "block.py"
    path.write_text(code)
    checked = subprocess.run(
        [RUFF, "check", "--no-cache", "--isolated", "--select", "F821,F822,F823", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, f"{doc} block {n}:\n{checked.stdout}"
