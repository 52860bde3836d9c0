"""The ``command`` agent: capability ``command.run`` runs an allow-listed program, no shell.

Only programs named on ``INTERLOCK_COMMAND_ALLOW`` (comma-separated; default
``echo,uname,true,false``) run, compared with ``argv[0]`` exactly. The first 64 KiB of
stdout and stderr are returned; a non-zero exit code is an answer, not a failure.

The default list holds programs that read no file whatever their arguments: what a
program prints goes into a run's outputs, which every reader of the installation sees,
and the agent runs beside credentials (``date -f FILE`` prints each line of ``FILE`` in
its error messages, ``cat``, ``head``, ``sort``, ``grep`` and most others read the files
they are given). Add such a program only where the agent's files may be read by all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import msgspec

from interlock.sdk import AgentError, TaskContext, Worker
from interlock_agents import capability_schemas

ALLOW_ENV = "INTERLOCK_COMMAND_ALLOW"
DEFAULT_ALLOW = "echo,uname,true,false"
OUTPUT_LIMIT = 64 * 1024

worker = Worker("command", concurrency=4)


class CommandInput(msgspec.Struct, kw_only=True, frozen=True):
    command: list[str]
    cwd: str | None = None
    timeout_s: float = 30.0


class CommandOutput(msgspec.Struct, kw_only=True, frozen=True):
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool


def allowed_programs() -> frozenset[str]:
    """Program names from ``$INTERLOCK_COMMAND_ALLOW`` (or the default list)."""
    raw = os.environ.get(ALLOW_ENV)
    if raw is None:
        raw = DEFAULT_ALLOW
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Keep the first ``limit`` bytes; drain the rest so the child never blocks on a pipe."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        if len(chunk) > room:
            truncated = True
        kept += chunk[: max(room, 0)]
    return bytes(kept), truncated


@worker.capability("command.run", **capability_schemas("command", "command.run"))
async def run_command(inp: CommandInput, ctx: TaskContext) -> CommandOutput:
    """Run ``inp.command`` if its program is allowed; answer with exit code and output."""
    if not inp.command:
        raise AgentError("command is empty")
    program = inp.command[0]
    allow = allowed_programs()
    if program not in allow:
        raise AgentError(
            f"{program!r} is not an allowed command (${ALLOW_ENV}: {', '.join(sorted(allow))})"
        )
    timeout = inp.timeout_s
    remaining = ctx.remaining()
    if remaining is not None:
        timeout = max(min(timeout, remaining), 0.1)
    try:
        proc = await asyncio.create_subprocess_exec(
            *inp.command,
            cwd=inp.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        raise AgentError(f"cannot run {program!r}: {exc}") from exc
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(timeout):
            (out, out_cut), (err, err_cut) = await asyncio.gather(
                _read_bounded(proc.stdout, OUTPUT_LIMIT), _read_bounded(proc.stderr, OUTPUT_LIMIT)
            )
            exit_code = await proc.wait()
    except TimeoutError:
        raise AgentError(f"{program!r} did not finish within {timeout:g} s") from None
    finally:
        if proc.returncode is None:  # timed out or cancelled: do not leave it running
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return CommandOutput(
        exit_code=exit_code,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        truncated=out_cut or err_cut,
    )
