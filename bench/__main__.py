"""``python -m bench``: every suite in turn; ``python -m bench SUITE [ARGS...]``: one suite."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

SUITES = {
    "core": "bench.core_bench",
    "runtime": "bench.runtime_bench",
    "replay": "bench.replay_bench",
    "client": "bench.client_bench",
    "cli": "bench.cli_bench",
    "gateway": "bench.gateway_bench",
    "peers": "bench.peers_bench",
    "console": "bench.console_bench",
    "guard": "bench.guard_bench",
    "fsync": "bench.fsync_bench",
    "batch": "bench.batch_bench",
    "hops": "bench.hops_bench",
    "worker": "bench.worker_bench",
    "steps": "bench.steps_bench",
    "longrun": "bench.longrun_bench",
    "fairness": "bench.fairness_bench",
    "runlist": "bench.runlist_bench",
    "scale": "bench.scale_bench",
    "owners": "bench.owners_bench",
}
"""Suite name -> module with ``main(argv: list[str] | None) -> int``."""


def _main_of(suite: str) -> Callable[[list[str] | None], int]:
    module = importlib.import_module(SUITES[suite])
    entry: Callable[[list[str] | None], int] = module.main
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        print("suites: " + ", ".join(SUITES))
        return 0
    if args and not args[0].startswith("-"):
        suite = args[0]
        if suite not in SUITES:
            sys.stderr.write(f"unknown suite {suite!r} (suites: {', '.join(SUITES)})\n")
            return 2
        return _main_of(suite)(args[1:])
    code = 0
    for suite in SUITES:
        print(f"== {suite}", flush=True)
        code = _main_of(suite)(args) or code
    return code


if __name__ == "__main__":
    sys.exit(main())
