"""A wrong flag prints the usage of the command it was given to, not the top-level one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

INTERLOCK = str(Path(sys.executable).with_name("interlock"))


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["runs", "--frobnicate"], "usage: interlock runs "),
        (["result", "r1", "--frobnicate"], "usage: interlock result "),
        (["dead-letters", "list", "--frobnicate"], "usage: interlock dead-letters list "),
        (
            ["creds", "issue", "publisher", "-o", "x", "--frobnicate"],
            "usage: interlock creds issue ",
        ),
        (["validate", "x.yaml", "--frobnicate"], "usage: interlock validate "),
    ],
)
def test_a_wrong_flag_prints_the_commands_usage(argv: list[str], usage: str) -> None:
    done = subprocess.run([INTERLOCK, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(usage), done.stderr
    assert done.stderr.rstrip().endswith("error: unrecognized arguments: --frobnicate")
    assert done.stdout == ""
