"""``interlock runs delete``: one ended run (or, for a run of a chain of runs continued as
new, the whole chain once its last run has ended), archived first when asked, recorded in
the audit stream."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from interlock.cli.common import CliError, print_json
from interlock.core.vocabulary import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from interlock.client import Client


async def cmd_runs_delete(client: Client, args: argparse.Namespace) -> int:
    from interlock.client import RunNotEnded

    try:
        deleted = await client.delete_run(
            args.run_id, archive_bucket=args.archive_bucket, archive_dir=args.archive_dir
        )
    except RunNotEnded as exc:
        raise CliError(str(exc), EXIT_FAILED) from exc
    if args.json:
        print_json(
            {
                "run_id": deleted.run_id,
                "status": deleted.status,
                "records": deleted.records,
                "archived_to": deleted.archived_to,
                "chain": list(deleted.chain),
            }
        )
        return EXIT_OK
    where = f", archived to {deleted.archived_to}" if deleted.archived_to else ""
    if deleted.chain:
        chain = " -> ".join(deleted.chain)
        print(f"deleted the chain {chain} ({deleted.status}, {deleted.records} records{where})")
        return EXIT_OK
    print(f"deleted {deleted.run_id} ({deleted.status}, {deleted.records} records{where})")
    return EXIT_OK
