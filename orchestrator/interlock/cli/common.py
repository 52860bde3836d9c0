"""What every command shares: exit codes, output helpers, reading manifest files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlock.core.vocabulary import (
    EXIT_DENIED,
    EXIT_FAILED,
    EXIT_NO_RUN,
    EXIT_NOT_FINISHED,
    EXIT_OK,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from interlock.core import events as ev
    from interlock.transport.objects import ObjectLimits

__all__ = [
    "EXIT_DENIED",
    "EXIT_FAILED",
    "EXIT_NOT_FINISHED",
    "EXIT_NO_RUN",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "InvalidInput",
    "add_object_flags",
    "err",
    "load_json_arg",
    "object_limits",
    "print_json",
    "read_records",
    "read_sources",
    "since_time",
]


class CliError(Exception):
    """An error the user can act on; printed without a traceback."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class InvalidInput(CliError):
    """Input that breaks a rule, printed as it is (``path:line:col: rule: message``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_FAILED)


def read_records(path: str) -> list[ev.AnyRecord]:
    """The records of an exported run log (``interlock export``: JSONL CloudEvents); a
    file that cannot be read is a usage error, one that is not a log a failure."""

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    from interlock.cli.exporting import read_export

    try:
        return read_export(data)
    except Exception as exc:
        raise CliError(f"{path}: not a run log: {exc}", EXIT_FAILED) from exc


def read_sources(paths: list[str]) -> list[tuple[str, str]]:
    """Read manifest files (``-`` is standard input); unreadable files are usage errors.

    A file beyond the loader's size limit is refused before it is read whole."""
    from interlock.core.source import MAX_BYTES, too_large

    out = []
    for path in paths:
        try:
            if path == "-":
                raw = sys.stdin.buffer.read(MAX_BYTES + 1)
                path = "<stdin>"
            else:
                with Path(path).open("rb") as f:
                    raw = f.read(MAX_BYTES + 1)
                    if len(raw) > MAX_BYTES:
                        f.seek(0, 2)
                        size = f.tell()
                        raise InvalidInput(str(too_large(path, size)))
            if len(raw) > MAX_BYTES:
                raise InvalidInput(str(too_large(path, len(raw), at_least=True)))
            out.append((path, raw.decode("utf-8")))
        except OSError as exc:
            raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise CliError(f"{path}: not UTF-8 text: {exc}") from exc
    return out


def load_json_arg(value: str | None, what: str) -> Any:
    """A JSON argument given inline or as ``@file``."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"{what}: cannot read {value[1:]}: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} col {exc.colno}"
        ) from exc
    except RecursionError:
        from interlock.core.bounds import MAX_DEPTH

        raise CliError(f"{what} nests deeper than {MAX_DEPTH} levels") from None


def since_time(value: str | None, flag: str = "--since") -> str | None:
    """``--since``: an RFC 3339 time (without an offset, UTC), or an age (``30s``, ``5m``,
    ``2h``, ``1d``) turned into the time that long ago; anything else is a usage error."""
    if value is None:
        return None
    from datetime import UTC, datetime

    from interlock.core.rfc3339 import since

    try:
        return since(value, datetime.now(UTC))
    except ValueError as exc:
        raise CliError(f"{flag} {exc}") from None


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def err(message: str) -> None:
    sys.stderr.write(message + "\n")


def add_object_flags(p: argparse.ArgumentParser) -> None:
    """``--object-threshold`` and ``--object-max-bytes`` (payloads kept by reference)."""
    p.add_argument(
        "--object-threshold",
        default=None,
        metavar="SIZE",
        help="payloads whose JSON is larger go to an object bucket, the log holding a "
        "reference (e.g. 256KiB; env INTERLOCK_OBJECT_THRESHOLD; default 256KiB)",
    )
    p.add_argument(
        "--object-max-bytes",
        default=None,
        metavar="SIZE",
        help="the largest payload stored or loaded by reference (e.g. 64MiB; env "
        "INTERLOCK_OBJECT_MAX_BYTES; default 64MiB)",
    )


def object_limits(args: argparse.Namespace) -> ObjectLimits:
    """The flags of :func:`add_object_flags`, else their variables, else the defaults."""
    from interlock.transport.objects import ObjectLimits, parse_bytes

    try:
        env = ObjectLimits.from_env()
        threshold, bound = env.threshold, env.max_bytes
        if args.object_threshold is not None:
            threshold = parse_bytes(args.object_threshold)
        if args.object_max_bytes is not None:
            bound = parse_bytes(args.object_max_bytes)
        return ObjectLimits(threshold=threshold, max_bytes=bound)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
