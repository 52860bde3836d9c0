"""``interlock completion bash|zsh``: a shell completion script for every command and flag.

The script is generated from the CLI's own parser by shtab (a small, well-kept library
that turns an argparse parser into static bash and zsh completion functions), so it never
drifts from the commands, and completing costs the shell nothing: no Python runs on TAB.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from interlock.cli.common import EXIT_OK

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

SHELLS = ("bash", "zsh")


def add_parsers(sub: Sub, root: argparse.ArgumentParser) -> None:
    """``completion``, for the commands of ``root`` (the whole CLI)."""
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description=(
            "bash: source <(interlock completion bash)   (or save it under "
            "/etc/bash_completion.d/). zsh: interlock completion zsh > "
            '"${fpath[1]}/_interlock", then restart the shell.'
        ),
    )
    p.add_argument("shell", choices=SHELLS)

    def cmd_completion(args: argparse.Namespace) -> int:
        sys.stdout.write(script(root, args.shell))
        return EXIT_OK

    p.set_defaults(func=cmd_completion)


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell``."""
    import shtab

    text: str = shtab.complete(parser, shell=shell)
    return text
