"""The `eventstore gc` subcommand: apply a retention policy to every session of a store.

    eventstore gc ROOT --idle 30d                      tombstone sessions idle for 30 days
    eventstore gc ROOT --archive-older-than 90d        prune archived history older than that
    eventstore gc ROOT --keep-events 1000 --dry-run    compact long logs (a dry run)

Owns the command-line view of `SessionStore.gc` (`eventstore.ops.retention.gc`): the
policy built from the options, a progress bar on stderr when it is a terminal, and the
report as text or JSON. Exit status: 0 done, 1 some sessions failed (the others were
done), 2 a usage error (no limit given, a missing store, an engine that cannot prune).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eventstore.cli.args import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Subparsers,
    add_command,
    add_root,
    age,
    nonneg_int,
)
from eventstore.cli.compact import Progress
from eventstore.cli.format import emit_json, fmt_bytes
from eventstore.cli.store import open_store
from eventstore.errors import InvalidArgumentError
from eventstore.ops.retention import GcReport, Policy, gc

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    """Register `gc`."""
    p = add_command(
        sub,
        "gc",
        run,
        "apply a retention policy to every session: tombstone idle ones, prune old"
        " archives, compact long logs (safe beside live writers)",
        "  eventstore gc .eventstore --idle 30d\n"
        "  eventstore gc .eventstore --idle 0s --dry-run\n"
        "  eventstore gc .eventstore --archive-older-than 90d --keep-events 1000 --json",
    )
    add_root(p)
    p.add_argument(
        "--idle", type=age, metavar="AGE", help="tombstone sessions idle longer than AGE (30d)"
    )
    p.add_argument(
        "--archive-older-than",
        type=age,
        metavar="AGE",
        help="prune archived history older than AGE (an archive_pruned event records it)",
    )
    p.add_argument(
        "--keep-events",
        type=nonneg_int,
        metavar="N",
        help="compact sessions whose live log holds more than N lines",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would go, change nothing")


def run(args: argparse.Namespace) -> int:
    """Execute `eventstore gc` for parsed `args`; returns the exit status."""
    if args.idle is None and args.archive_older_than is None and args.keep_events is None:
        raise CliError("give at least one of --idle, --archive-older-than, --keep-events")
    try:
        policy = Policy(args.idle, args.archive_older_than, args.keep_events)
    except InvalidArgumentError as exc:
        raise CliError(str(exc)) from None
    with open_store(args) as store:
        bar = Progress(0, False)

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar.total != total:
                bar = Progress(total, sys.stderr.isatty() and not args.json)
            bar.update(done, "gc")

        report = gc(store.core, policy, dry_run=args.dry_run, progress=progress)
        bar.close()
    if args.json:
        emit_json(_as_json(report))
    else:
        _print(report)
    return EXIT_PROBLEMS if report.failed else EXIT_OK


def _as_json(r: GcReport) -> dict[str, Any]:
    return {
        "dry_run": r.dry_run,
        "sessions": r.sessions,
        "tombstoned": r.tombstoned,
        "kept": r.kept,
        "compacted": r.compacted,
        "pruned": [
            {
                "session_id": p.session_id,
                "segments": [s.where for s in p.segments],
                "bytes": p.bytes,
            }
            for p in r.pruned
        ],
        "pruned_segments": r.pruned_segments,
        "pruned_bytes": r.pruned_bytes,
        "failed": [{"session_id": sid, "error": why} for sid, why in r.failed],
        "bytes_freed": r.bytes_freed,
    }


def _print(r: GcReport) -> None:
    would = "would be " if r.dry_run else ""
    for sid in r.tombstoned:
        print(f"{'would delete' if r.dry_run else 'deleted':<12}  {sid}")
    for sid in r.kept:
        print(f"{'kept':<12}  {sid}  (written to while gc ran)")
    for sid in r.compacted:
        print(f"{'would compact' if r.dry_run else 'compacted':<12}  {sid}")
    for p in r.pruned:
        print(f"{'would prune' if r.dry_run else 'pruned':<12}  {p.session_id}"
              f"  ({len(p.segments)} archived logs, {fmt_bytes(p.bytes)})")  # fmt: skip
    for sid, why in r.failed:
        print(f"{'failed':<12}  {sid}: {why}")
    print(
        f"{r.sessions} sessions: {len(r.tombstoned)} {would}tombstoned, {len(r.compacted)}"
        f" {would}compacted, {r.pruned_segments} archived logs {would}pruned;"
        f" {fmt_bytes(r.bytes_freed)} {would}freed; {len(r.failed)} failed"
    )
