"""What the hostile-input tests share: the runtime tests' helpers, a CLI run under a memory
ceiling, and the manifests they feed.

Every command here runs as a separate process with its address space capped
(``RLIMIT_AS``), so a loader that expands a file without bound dies of ``MemoryError``
instead of passing, and with a wall-clock ``timeout``.
"""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from support.runtime import (
    ECHO_MANIFEST,
    INTERLOCK,
    TIMEOUT,
    Background,
    DeadLetters,
    Stack,
    cli_env,
    connect,
    eventually,
    run_cli,
    running_stack,
    yaml,
)

__all__ = [
    "ECHO_MANIFEST",
    "TIMEOUT",
    "Background",
    "DeadLetters",
    "Stack",
    "cli_env",
    "connect",
    "eventually",
    "run_cli",
    "running_stack",
    "yaml",
]

MEMORY_CAP = 1024 * 1024 * 1024
"""Address space a CLI process may use (a bare ``interlock validate`` takes ~300 MB)."""


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    seconds: float
    cpu: float
    """CPU time (user and system) the command took: unlike its wall time, not stretched by
    other processes taking the machine's cores."""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_capped(
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    stdin: bytes | None = None,
) -> Ran:
    """``interlock ARGS`` with its memory capped; output captured as text."""
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [INTERLOCK, *args],
        env=None if env is None else dict(env),
        capture_output=True,
        timeout=timeout,
        input=stdin,
        preexec_fn=_cap_memory,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Ran(
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
        time.monotonic() - started,
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
    )


def billion_laughs(levels: int = 9, width: int = 10) -> str:
    """A workflow whose ignored ``x-`` key expands to ``width ** levels`` strings."""
    lines = [
        "apiVersion: interlock.io/v1",
        "kind: Workflow",
        "metadata: {name: laughs}",
        "x-laughs:",
        "  a0: &a0 [" + ", ".join(['"lol"'] * width) + "]",
    ]
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines += [
        "spec:",
        "  initial_state: done",
        "  states:",
        "    done: {type: terminal}",
    ]
    return "\n".join(lines) + "\n"


def deeply_nested(levels: int = 10_000) -> str:
    """A workflow with a value nested ``levels`` deep under an ``x-`` key."""
    return (
        "apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: deep}\n"
        f"x-deep: {'[' * levels}{']' * levels}\n"
        "spec:\n  initial_state: done\n  states:\n    done: {type: terminal}\n"
    )


def huge_manifest(path: Path, size: int = 50 * 1024 * 1024) -> Path:
    """A 50 MB workflow (a long string under an ``x-`` key), written to ``path``."""
    head = b"apiVersion: interlock.io/v1\nkind: Workflow\nmetadata: {name: huge}\nx-pad: '"
    tail = b"'\nspec:\n  initial_state: done\n  states:\n    done: {type: terminal}\n"
    with path.open("wb") as f:
        f.write(head)
        chunk = b"a" * (1024 * 1024)
        left = size - len(head) - len(tail)
        while left > 0:
            f.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
        f.write(tail)
    return path


ECHO_FLOW = """\
apiVersion: interlock.io/v1
kind: Workflow
metadata:
  name: bystander
spec:
  initial_state: work
  states:
    work:
      actions:
        - capability: echo
          input: {n: 1}
      on:
        - {event: task.completed, goto: done}
    done:
      type: terminal
      outputs:
        n: "$.states.work.output.n"
"""
"""An unrelated run that must complete while something hostile is going on."""

PINGED = ECHO_FLOW.replace("name: bystander", "name: pinged").replace(
    "spec:\n", "spec:\n  triggers:\n    - event: acme.ping\n", 1
)
"""The bystander's steps as the workflow ``pinged``, started by each ``acme.ping`` event."""


async def bystander_completes(stack: Stack) -> None:
    """Start the unrelated ``bystander`` run and see it complete (within ``TIMEOUT``)."""
    run_id = await stack.client.start("bystander", {})
    state = await stack.wait(run_id)
    assert state.status == "completed", state
    assert state.outputs == {"n": 1}
