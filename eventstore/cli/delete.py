"""The `eventstore delete` subcommand: remove sessions, by name or by age.

    eventstore delete ROOT SESSION...              remove these sessions (log, archive, caches)
    eventstore delete ROOT --older-than 30d        remove every session idle for 30 days
    eventstore delete ROOT --older-than 12h --dry-run

and the `--prune-archive-before SEQ|TIME` option of `eventstore compact`
(`add_prune_option` registers it on compact's parser, `prune_after_compact` runs it).

Owns the command-line view of `SessionStore.delete_session`,
`eventstore.ops.lifecycle.delete_older_than` and `prune_archive`. `add_parser` registers
`delete`; `run` executes it.
Exit status: 0 done, 1 a session could not be removed (the others were), 2 a usage error
(a missing store, an unknown session: nothing is removed then).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import msgspec

from eventstore.cli.args import age
from eventstore.cli.claude_code import missing_store
from eventstore.cli.store import is_stored
from eventstore.engines.base import redact_text
from eventstore.errors import (
    EventStoreError,
    InvalidArgumentError,
)
from eventstore.ops.history import history_files, parse_time
from eventstore.ops.lifecycle import (
    ExpiryResult,
    delete_older_than,
    prune_archive,
)
from eventstore.store import SessionStore

__all__ = ["add_parser", "add_prune_option", "check_prune_before", "prune_after_compact", "run"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_EXAMPLES = """\
examples:
  eventstore delete .eventstore other          delete it, a tombstone stays
  eventstore delete .eventstore other --purge  remove it without a trace
  eventstore delete .eventstore --older-than 30d        idle for 30 days
  eventstore delete .eventstore --older-than 12h --dry-run --json
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `delete` on the `eventstore` command's subparsers (sets `func=run`)."""
    p = subparsers.add_parser(
        "delete",
        help="delete sessions (log, archive and caches, atomically), by name or by age",
        description=(
            "Delete the named sessions, or with --older-than every session whose last\n"
            "event is older than AGE (30d, 12h, 90m, 45s, 2w). Each session goes at once\n"
            "and whole: a reader sees all of it or none of it, beside live writers too.\n"
            "A tombstone stays (when, by whom, the last seq and hash): a later write to\n"
            "the id is refused until it is restored; --purge leaves no trace."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("root", metavar="ROOT", help="the store: a directory or a URL")
    p.add_argument("sessions", metavar="SESSION", nargs="*", help="sessions to delete")
    p.add_argument(
        "--older-than", metavar="AGE", type=age, help="delete sessions idle for longer than AGE"
    )
    p.add_argument("--dry-run", action="store_true", help="show what would be deleted")
    p.add_argument(
        "--purge", action="store_true", help="leave no tombstone (tombstones too are removed)"
    )
    p.add_argument("--json", action="store_true", help="print JSON (a list of results)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute `eventstore delete` for parsed `args`; returns the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err

    def usage(message: str) -> int:
        # the message may quote ROOT, a URL: never print its password
        print(f"eventstore delete: error: {redact_text(message)}", file=err)
        return EXIT_USAGE

    if bool(args.sessions) == (args.older_than is not None):
        return usage("give SESSION names or --older-than AGE (one of them)")
    if missing_store(args.root):  # deleting never creates a store
        return usage(f"no store at {args.root}")
    try:
        store = SessionStore(args.root)
    except (EventStoreError, OSError) as exc:
        return usage(str(exc))
    with store:
        if args.older_than is not None:
            results = delete_older_than(
                store.core, args.older_than, dry_run=args.dry_run, purge=args.purge
            )
        else:
            # what the store holds of each (a tombstone too), not whether a listing
            # names it: a session whose head was deleted from outside is purged by name
            missing = [s for s in args.sessions if not is_stored(store, s)]
            if missing:
                return usage(f"unknown session {missing[0]!r} in {args.root} (nothing deleted)")
            results = []
            for sid in args.sessions:
                if args.dry_run:
                    results.append(ExpiryResult(sid, None, "would delete"))
                    continue
                try:
                    gone = store.delete_session(sid, purge=args.purge)
                    results.append(ExpiryResult(sid, None, "deleted" if gone else "gone"))
                except (EventStoreError, OSError) as exc:
                    results.append(ExpiryResult(sid, None, "failed", " ".join(str(exc).split())))
    failed = [r for r in results if r.result == "failed"]
    if args.json:
        out.write(msgspec.json.format(msgspec.json.encode(results), indent=2).decode() + "\n")
    else:
        for r in results:
            when = (
                ""
                if r.last_activity is None
                else f"  (last event {r.last_activity.astimezone(UTC):%Y-%m-%d %H:%M:%SZ})"
            )
            detail = f": {r.error}" if r.error else ""
            print(f"{r.result:<12}  {r.session_id}{when}{detail}", file=out)
        done = sum(r.result in ("deleted", "would delete") for r in results)
        verb = "would be deleted" if args.dry_run else "deleted"
        print(f"{done} {verb}, {len(failed)} failed", file=out)
    return EXIT_FAILED if failed else EXIT_OK


# -- compact --prune-archive-before ------------------------------------------------------


def _seq_or_time(text: str) -> int | datetime:
    if text.isdigit():
        # refused here, before `compact` has changed anything, not by `prune_archive`
        # after the session was compacted
        if int(text) < 1:
            raise argparse.ArgumentTypeError(f"not a sequence number >= 1: {text!r}")
        return int(text)
    try:
        return parse_time(text)
    except InvalidArgumentError:
        raise argparse.ArgumentTypeError(
            f"not a sequence number or an ISO 8601 time in UTC's range: {text!r}"
        ) from None


def add_prune_option(p: argparse.ArgumentParser) -> None:
    """Add `--prune-archive-before SEQ|TIME` to the `compact` parser."""
    p.add_argument(
        "--prune-archive-before",
        type=_seq_or_time,
        metavar="SEQ|TIME",
        help="after compacting, remove archived history wholly before SEQ or TIME"
        " (recorded as an archive_pruned event)",
    )


def check_prune_before(store: SessionStore, sid: str, args: argparse.Namespace) -> None:
    """Refuse a `--prune-archive-before SEQ` past the end of the session's history (a
    typo such as 99999 would remove its whole archive): at most the seq after its last
    event (which prunes every archived event). InvalidArgumentError naming the last
    archived seq and the last event; checked before the session is compacted."""
    before = getattr(args, "prune_archive_before", None)
    if not isinstance(before, int):
        return
    head = store.last_seq(sid)
    if before <= head + 1:
        return
    archived = [f.last_seq for f in history_files(store.core, sid) if f.archived and f.last_seq]
    kept = f"its archive ends at seq {max(archived)}" if archived else "it has no archive yet"
    raise InvalidArgumentError(
        f"--prune-archive-before {before} is past the end of session {sid!r}: {kept}, its"
        f" last event is seq {head}; give at most {head + 1} to prune all of its archive"
        " (nothing was changed)"
    )


def prune_after_compact(
    store: SessionStore, sid: str, args: argparse.Namespace, res: dict[str, Any]
) -> None:
    """Run `--prune-archive-before` for one session `compact` just compacted (or found
    compact), adding to its result `res` what was pruned (`pruned_segments`,
    `pruned_bytes`, `pruned_event_seq`, a note in `detail`); nothing when the option is
    absent or on a dry run. Errors propagate (compact reports the session as failed)."""
    before = getattr(args, "prune_archive_before", None)
    if before is None or args.dry_run:
        return
    report = prune_archive(store.core, sid, before)
    res.update(
        pruned_segments=[s.where for s in report.segments],
        pruned_bytes=report.bytes,
        pruned_event_seq=report.event_seq,
    )
    res["detail"] += f"; pruned {len(report.segments)} archived logs"
