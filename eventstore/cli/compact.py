"""The `compact` command: compact many sessions into snapshots, offline or beside live
writers; one failure never stops the rest. A view of `SessionStore.compact`.

Whether a session is worth compacting (`--min-bytes`, `--min-events`) is decided from
its head (the live log's size and sequence numbers), never by reading the log whole and
never through a link; so is `--dry-run`, which skips what the real run skips by those
thresholds and a log that is already one snapshot (the head tells it), but cannot tell
whether a snapshot would be smaller without building it (`compact(dry_run=True)` in the
library does that, at a compaction's cost). A `--prune-archive-before SEQ`
past the end of a session's history is refused for that session before anything
changes. On a terminal a progress bar runs on stderr while each session's line is
printed above it.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from eventstore.cli.args import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Subparsers,
    add_command,
    add_root,
    nonneg_int,
)
from eventstore.cli.delete import (
    add_prune_option,
    check_prune_before,
    prune_after_compact,
)
from eventstore.cli.format import (
    emit_json,
    fmt_bytes,
    one_line,
    plural,
    shorten,
)
from eventstore.cli.store import (
    need_sessions,
    open_store,
    shown_root,
)
from eventstore.errors import (
    EventStoreError,
    UnknownSessionError,
)
from eventstore.store import SessionStore

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    """Register `compact`."""
    p = add_command(
        sub,
        "compact",
        run,
        "compact sessions into snapshots (safe beside live writers)",
        "  eventstore compact .eventstore --all\n"
        "  eventstore compact .eventstore demo other --no-archive\n"
        "  eventstore compact .eventstore --all --min-bytes 1000000 --dry-run --json",
    )
    add_root(p)
    p.add_argument("sessions", metavar="SESSION", nargs="*", help="sessions to compact")
    p.add_argument("--all", action="store_true", help="every session of the store")
    p.add_argument(
        "--min-bytes",
        type=nonneg_int,
        default=0,
        metavar="N",
        help="skip logs smaller than N bytes",
    )
    p.add_argument(
        "--min-events",
        type=nonneg_int,
        default=0,
        metavar="N",
        help="skip logs of fewer than N events",
    )
    p.add_argument(
        "--no-archive", action="store_true", help="do not keep the old log in the archive"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="compact even a log the snapshot would not make smaller (skipped otherwise)",
    )
    p.add_argument("--dry-run", action="store_true", help="show what would be compacted")
    add_prune_option(p)


class Progress:
    """A one-line progress bar on a terminal (`out`, stderr); nothing otherwise. Lines
    printed through `line` appear above the bar, which is redrawn below them."""

    def __init__(self, total: int, enabled: bool, out: TextIO | None = None) -> None:
        self.total = total
        self.enabled = enabled and total > 0
        self.out = sys.stderr if out is None else out
        self._shown = ""

    def update(self, done: int, label: str) -> None:
        """Redraw the bar at `done` of `total`, naming what is being done."""
        if not self.enabled:
            return
        width = 30
        filled = width * done // self.total
        self._shown = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {shorten(label, 30):<30}"
        )
        self.out.write("\r" + self._shown)
        self.out.flush()

    def line(self, text: str) -> None:
        """Print `text` on stdout above the bar (the bar is cleared, then redrawn)."""
        if self.enabled:
            self._clear()
        print(text, flush=True)
        if self.enabled and self._shown:
            self.out.write(self._shown)
            self.out.flush()

    def close(self) -> None:
        """Remove the bar."""
        if self.enabled:
            self._clear()

    def _clear(self) -> None:
        self.out.write("\r" + " " * len(self._shown) + "\r")
        self.out.flush()


def run(args: argparse.Namespace) -> int:
    """Compact the named sessions (or --all); exit 1 if any failed."""
    if args.all and args.sessions:
        raise CliError("give SESSION names or --all, not both")
    if not args.all and not args.sessions:
        raise CliError("give SESSION names or --all")
    t0 = time.perf_counter()
    with open_store(args) as store:
        if args.all:
            ids = store.list_sessions()
        else:
            need_sessions(store, args.sessions, shown_root(args))
            ids = list(dict.fromkeys(args.sessions))
        results: list[dict[str, Any]] = []
        bar = Progress(len(ids), sys.stderr.isatty() and not args.json)
        for n, sid in enumerate(ids, 1):
            bar.update(n - 1, sid)
            res = _compact_one(store, sid, args)
            results.append(res)
            if not args.json:
                bar.line(_compact_line(res))
        bar.update(len(ids), "done")
        bar.close()
    summary = {
        "compacted": sum(1 for r in results if r["result"] in ("compacted", "would compact")),
        "skipped": sum(1 for r in results if r["result"] == "skipped"),
        "failed": sum(1 for r in results if r["result"] == "failed"),
        "bytes_before": sum(r["bytes_before"] for r in results),
        "bytes_after": sum(r["bytes_after"] for r in results),
        "seconds": round(time.perf_counter() - t0, 3),
        "dry_run": args.dry_run,
    }
    if args.json:
        emit_json({**summary, "sessions": results})
    else:
        verb = "would compact" if args.dry_run else "compacted"
        print(
            f"{summary['compacted']} {verb}, {summary['skipped']} skipped,"
            f" {summary['failed']} failed;"
            f" {fmt_bytes(summary['bytes_before'])} -> {fmt_bytes(summary['bytes_after'])}"
            f" in {summary['seconds']:.2f} s"
        )
    return EXIT_PROBLEMS if summary["failed"] else EXIT_OK


def live_log_size(store: SessionStore, sid: str) -> tuple[int, int, bool]:
    """(bytes, events, whether it is one snapshot) of the session's live log, from its
    head alone: never read whole (the file engine reads the tail and refuses links). A
    lone line is a snapshot when what the next line chains to is not its own `h` but the
    snapshot's `base_h`."""
    head = store.engine.head(sid)
    if head.seq == 0:
        raise UnknownSessionError(f"session {sid!r} has no committed event")
    events = head.seq - head.base_seq + 1
    return head.size, events, events == 1 and head.link != head.h


def _compact_one(store: SessionStore, sid: str, args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {
        "session_id": sid,
        "result": "failed",
        "bytes_before": 0,
        "bytes_after": 0,
        "events_before": 0,
        "events_after": 0,
        "archive": None,  # the archived segment's name (the engine's: any engine)
        "archive_path": None,  # its file (the file engine only)
        "skipped": None,
        "detail": "",
    }
    try:
        size, events, one_snapshot = live_log_size(store, sid)
        res.update(bytes_before=size, bytes_after=size, events_before=events, events_after=events)
        described = f"{fmt_bytes(size)}, {plural(events, 'event')}"
        check_prune_before(store, sid, args)
        if size < args.min_bytes or events < args.min_events:
            res.update(
                result="skipped",
                skipped="below_threshold",
                detail=f"below the threshold ({described})",
            )
            return res
        if args.dry_run and one_snapshot:  # as the real run skips it (said the same way)
            res.update(
                result="skipped", skipped="one_snapshot", detail="the log is already one snapshot"
            )
            return res
        if args.dry_run:
            res.update(result="would compact", detail=described)
            return res
        rep = store.compact(sid, archive=not args.no_archive, force=args.force)
        if not rep.compacted:
            # nothing changed: the reason in words (the snapshot's size when it is that)
            res.update(result="skipped", skipped=rep.skipped, detail="; ".join(rep.notes))
            prune_after_compact(store, sid, args, res)
            return res
        res.update(
            result="compacted",
            bytes_before=rep.bytes_before,
            bytes_after=rep.bytes_after,
            events_before=rep.events_before,
            events_after=rep.events_after,
            archive=rep.archive,
            archive_path=str(rep.archive_path) if rep.archive_path else None,
            detail=f"seq {rep.first_seq}..{rep.last_seq} in {rep.seconds:.3f} s",
        )
        prune_after_compact(store, sid, args, res)
    except (EventStoreError, OSError, ValueError) as exc:
        res.update(result="failed", detail=one_line(exc))
    return res


def _compact_line(r: dict[str, Any]) -> str:
    if r["result"] == "compacted":
        sizes = f"{fmt_bytes(r['bytes_before'])} -> {fmt_bytes(r['bytes_after'])}"
        lines = f"{r['events_before']} -> {plural(r['events_after'], 'line')}"
        return f"compacted      {r['session_id']}: {sizes}, {lines} ({r['detail']})"
    return f"{r['result']:<14} {r['session_id']}: {r['detail']}"
