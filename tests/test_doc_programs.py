"""The Python in the docs is programs a reader can run: each block compiles as a module
and uses no name it does not define or import (docs/client.md's blocks are also run, by
tests/runtime/test_client_docs.py). docs/operations.md's setup on one machine runs as written."""

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


def shell_block(doc: str, after: str) -> list[str]:
    """The commands of the first ``sh`` block of ``doc`` after the text ``after``."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    found = re.search(r"```sh\n(.*?)```", text[text.index(after) :], re.DOTALL)
    assert found is not None
    return [line.split("  #")[0].strip() for line in found[1].splitlines() if line[:1].isalpha()]


def test_the_one_machine_setup_runs_as_written(tmp_path: Path) -> None:
    """docs/operations.md's processes on one machine, as an operator types them: the
    credentials before any server runs, then a nats-server trusting them (on a free port,
    not 4222) that the operator's credential reaches."""
    import os
    import shlex
    import socket

    commands = shell_block("operations.md", "The same pieces as separate processes")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "NATS_"))}
    env["INTERLOCK_CONTEXT"] = str(tmp_path / "nowhere.json")
    bin_dir = Path(sys.executable).parent
    for line in [c for c in commands if c.startswith("interlock creds")]:
        argv = shlex.split(line)
        done = subprocess.run(
            [str(bin_dir / argv[0]), *argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{line}\n{done.stderr}"
    (server_line,) = [c for c in commands if c.startswith("nats-server")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = shlex.split(server_line.rstrip("&").strip())
    server = subprocess.Popen(
        [str(bin_dir / argv[0]), *argv[1:], "-a", "127.0.0.1", "-p", str(port)], cwd=tmp_path
    )
    try:
        env |= {"INTERLOCK_URL": f"nats://127.0.0.1:{port}", "INTERLOCK_CREDS": "operator.creds"}
        done = subprocess.run(
            [str(bin_dir / "interlock"), "workflows"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
