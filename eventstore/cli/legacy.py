"""The `import-legacy` command: import the older design's per-session JSON state files
(`LEGACY_DIR/sessions/<hex id>.json`) into a store. A view of `eventstore.ops.legacy`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eventstore.cli.args import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Subparsers,
    add_command,
    add_full,
    add_root,
)
from eventstore.cli.format import (
    emit_json,
    plural,
    table,
)
from eventstore.cli.store import open_store

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    """Register `import-legacy`."""
    p = add_command(
        sub,
        "import-legacy",
        run,
        "import the older design's per-session JSON files (idempotent)",
        "  eventstore import-legacy .eventstore /var/lib/harness/state",
    )
    add_root(p)
    p.add_argument(
        "legacy_dir", metavar="LEGACY_DIR", type=Path, help="holds sessions/<hex id>.json"
    )
    add_full(p)


def run(args: argparse.Namespace) -> int:
    """Import every legacy file; exit 1 if any failed (the others are still imported)."""
    from eventstore.ops import legacy

    if not args.legacy_dir.is_dir():
        raise CliError(f"no legacy directory at {args.legacy_dir}")
    with open_store(args, create=True) as store:
        report = legacy.import_legacy(store.core, args.legacy_dir)
    if args.json:
        emit_json(report)
    else:
        if report.items:
            rows = [
                [i.result, i.session_id or "-", i.events, Path(i.file).name, i.detail]
                for i in report.items
            ]
            headers = ["RESULT", "SESSION", "EVENTS", "FILE", "DETAIL"]
            print(table(headers, rows, right=(2,), flex=4, full=args.full))
            print()
        print(
            f"{report.imported} imported, {report.skipped} skipped, {report.failed} failed"
            f" ({plural(len(report.items), 'file')} in {args.legacy_dir})"
        )
    return EXIT_PROBLEMS if report.failed else EXIT_OK
