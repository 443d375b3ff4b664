"""The read-only views of a store: `sessions`, `log`, `state`, `transcript`, `stats` and
`export`. Each formats what one library call returns (`SessionStore`, `eventstore.ops.audit`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from eventstore.cli import session_list
from eventstore.cli.args import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Subparsers,
    add_as_of,
    add_command,
    add_full,
    add_root,
    add_session,
    nonneg_int,
    parse_time,
)
from eventstore.cli.format import (
    emit_json,
    emit_json_line,
    event_line,
    fmt_bytes,
    fmt_time,
    kv,
    one_line,
    plural,
    render_state,
    table,
)
from eventstore.cli.store import (
    known_session,
    open_store,
    root_hint,
    shown_root,
)
from eventstore.cli.transcript_text import describe_message
from eventstore.errors import (
    EventStoreError,
    HistoryPrunedError,
)
from eventstore.format.events import Event
from eventstore.ops import audit
from eventstore.ops.export import event_to_json
from eventstore.store import SessionStore

__all__ = ["add_parser"]


def add_parser(sub: Subparsers) -> None:
    """Register `sessions`, `log`, `state`, `transcript`, `stats` and `export`."""
    p = add_command(
        sub,
        "sessions",
        run_sessions,
        "list the sessions of a store (exit 1 if one cannot be read; the others are listed),"
        " or a page of them, newest first",
        "  eventstore sessions .eventstore\n  eventstore sessions .eventstore --deleted\n"
        "  eventstore sessions .eventstore --limit 20 --label team=red",
    )
    add_root(p)
    p.add_argument(
        "--deleted", action="store_true", help="list the deleted sessions' tombstones instead"
    )
    session_list.add_options(p)

    p = add_command(
        sub,
        "log",
        run_log,
        "show a session's events, one per line",
        "  eventstore log .eventstore demo\n"
        "  eventstore log .eventstore demo --type progress_appended --type snapshot\n"
        "  eventstore log .eventstore demo --from-seq 10 --to-seq 20 --full\n"
        "  eventstore log .eventstore demo --since 2026-11-29T15:00 --json | jq .type",
    )
    add_session(p)
    p.add_argument(
        "--type", action="append", metavar="TYPE", help="only events of TYPE (repeatable)"
    )
    p.add_argument(
        "--from-seq",
        type=nonneg_int,
        metavar="N",
        help="first sequence number (default: the first the history keeps)",
    )
    p.add_argument("--to-seq", type=nonneg_int, metavar="N", help="last sequence number")
    p.add_argument("--since", type=parse_time, metavar="T", help="appended at or after T")
    p.add_argument("--until", type=parse_time, metavar="T", help="appended at or before T")
    add_full(p)

    p = add_command(
        sub,
        "state",
        run_state,
        "show the bootstrap state (now, or as of a seq or a time)",
        "  eventstore state .eventstore demo\n  eventstore state .eventstore demo --at-seq 12\n"
        "  eventstore state .eventstore demo --at-time 2026-11-29T15:40:00Z --json",
    )
    add_session(p)
    add_as_of(p)
    add_full(p)

    p = add_command(
        sub,
        "transcript",
        run_transcript,
        "show the transcript (now, or as of a seq or a time)",
        "  eventstore transcript .eventstore demo --last 5\n"
        "  eventstore transcript .eventstore demo --full",
    )
    add_session(p)
    p.add_argument("--last", type=nonneg_int, metavar="N", help="only the last N messages")
    add_as_of(p)
    add_full(p)

    p = add_command(
        sub,
        "stats",
        run_stats,
        "events per type, bytes, first/last time, archive size",
        "  eventstore stats .eventstore demo",
    )
    add_session(p)

    p = add_command(
        sub,
        "export",
        run_export,
        "export a session as JSON (its state) or JSONL (its raw events)",
        "  eventstore export .eventstore demo > demo.json\n"
        "  eventstore export .eventstore demo --format jsonl | jq -c '{seq, type}'",
    )
    add_session(p)
    p.add_argument(
        "--format",
        choices=("json", "jsonl", "claude-code"),
        default="json",
        help="json (default), jsonl, or claude-code (the imported Claude Code lines)",
    )


# -- sessions --------------------------------------------------------------------------


def _session_row(store: SessionStore, sid: str) -> dict[str, Any]:
    """One row of `sessions`, from the session's head and the names of its history
    (nothing is read whole); raises for a session that cannot be read safely."""
    head = store.engine.head(sid)
    files = audit.history_files(store.core, sid)
    return {
        "session_id": sid,
        "last_seq": head.seq,
        "log_bytes": head.size,
        "log_events": head.seq - head.base_seq + 1 if head.seq else 0,
        "archive_files": sum(1 for f in files if f.archived),
        "error": None,
    }


def _run_deleted(args: argparse.Namespace) -> int:
    """`sessions --deleted`: every tombstone, when and by whom."""
    with open_store(args) as store:
        rows = [
            {"session_id": t.session_id, "deleted_at": t.deleted_at.isoformat(), "by": t.by,
             "last_seq": t.last_seq, "last_h": t.last_h, "erased": t.erased}
            for t in store.deleted_sessions()
        ]  # fmt: skip
    if args.json:
        emit_json(rows)
    elif not rows:
        print(f"no deleted sessions in {shown_root(args)}")
    else:
        print(
            table(
                ["SESSION", "DELETED", "BY", "LAST SEQ", "ERASED"],
                [
                    [
                        r["session_id"],
                        r["deleted_at"],
                        r["by"],
                        r["last_seq"],
                        "yes" if r["erased"] else "no",
                    ]
                    for r in rows
                ],  # fmt: skip
                right=(3,),
            )
        )
    return EXIT_OK


def run_sessions(args: argparse.Namespace) -> int:
    """List a store's sessions; one that cannot be read is reported, never hides the rest.
    With a paging option, a page of the session index instead (eventstore.cli.session_list)."""
    if getattr(args, "deleted", False):
        return _run_deleted(args)
    if session_list.paged(args):
        return session_list.run_page(args)
    with open_store(args) as store:
        rows: list[dict[str, Any]] = []
        for sid in store.list_sessions():
            try:
                rows.append(_session_row(store, sid))
            except (EventStoreError, OSError) as exc:
                rows.append(
                    {"session_id": sid, "last_seq": None, "log_bytes": None,
                     "log_events": None, "archive_files": None, "error": one_line(exc)}
                )  # fmt: skip
    bad = [r for r in rows if r["error"]]
    status = EXIT_PROBLEMS if bad else EXIT_OK
    if args.json:
        emit_json(rows)
        return status
    good = [r for r in rows if not r["error"]]
    if not rows:
        print(f"no sessions in {shown_root(args)}")
        hint = root_hint(args)
        if hint is not None:
            print(f"eventstore: hint: {hint}", file=sys.stderr)
    elif good:
        print(
            table(
                ["SESSION", "LAST SEQ", "LOG", "IN LOG", "ARCHIVED"],
                [
                    [
                        r["session_id"],
                        r["last_seq"],
                        fmt_bytes(r["log_bytes"]),
                        r["log_events"],
                        r["archive_files"],
                    ]
                    for r in good
                ],
                right=(1, 2, 3, 4),
            )
        )
    for r in bad:
        print(f"eventstore: session {r['session_id']!r} unreadable: {r['error']}", file=sys.stderr)
    if bad:
        print(f"{plural(len(bad), 'session')} of {len(rows)} could not be read", file=sys.stderr)
    return status


# -- log -------------------------------------------------------------------------------


def _check_types(store: SessionStore, types: list[str] | None) -> None:
    known = sorted(store.codec.types)
    for t in types or []:
        if t not in store.codec.types:
            raise CliError(
                f"unknown event type {t!r}; known types: {', '.join(known)}"
                " (load custom ones with --event-types MODULE:ATTR)"
            )


def run_log(args: argparse.Namespace) -> int:
    """The session's events, one per line."""
    with open_store(args) as store, known_session(store, args.session, shown_root(args)):
        _check_types(store, args.type)
        from_seq = args.from_seq
        if from_seq is None:  # the whole history kept: after pruning, from its first event
            from_seq = store.first_kept_seq(args.session)
            if from_seq > 1:
                print(
                    f"eventstore: events 1..{from_seq - 1} of {args.session!r} were pruned"
                    f" from the archive; showing from seq {from_seq}",
                    file=sys.stderr,
                )
        events: Iterable[Event] = audit.read_events(
            store.core, args.session, from_seq=from_seq, to_seq=args.to_seq, types=args.type
        )
        if args.since or args.until:
            since, until = args.since, args.until
            events = (
                e
                for e in events
                if (since is None or e.ts >= since) and (until is None or e.ts <= until)
            )
        try:
            if args.json:
                for ev in events:
                    emit_json_line(event_to_json(ev))
                return EXIT_OK
            rows = [event_line(ev) for ev in events]
        except HistoryPrunedError as exc:  # raised before any event is printed
            raise CliError(f"{exc} (--from-seq {exc.first_kept} shows what is kept)") from None
    if not rows:
        print("no events match")
        return EXIT_OK
    print(table(["SEQ", "TIME", "TYPE", "SUMMARY"], rows, right=(0,), flex=3, full=args.full))
    return EXIT_OK


# -- state and transcript --------------------------------------------------------------


def _as_of(
    args: argparse.Namespace, store: SessionStore
) -> tuple[int | None, datetime | None, str]:
    if args.at_seq is not None:
        return args.at_seq, None, f"as of seq {args.at_seq}"
    if args.at_time is not None:
        return None, args.at_time, f"as of {fmt_time(args.at_time)}"
    return None, None, f"seq {store.last_seq(args.session)}, current"


def run_state(args: argparse.Namespace) -> int:
    """The bootstrap state, now or as of a sequence number or a time."""
    with open_store(args) as store, known_session(store, args.session, shown_root(args)):
        seq, at, where = _as_of(args, store)
        if seq is None and at is None:
            state = store.load_bootstrap_state(args.session)
        else:
            state = audit.state_at(store.core, args.session, seq=seq, at=at)
    if args.json:
        emit_json(state)
    else:
        print(render_state(args.session, state, args.full, where))
    return EXIT_OK


def run_transcript(args: argparse.Namespace) -> int:
    """The transcript (its last N messages with --last)."""
    with open_store(args) as store, known_session(store, args.session, shown_root(args)):
        seq, at, _ = _as_of(args, store)
        if seq is None and at is None:
            messages = store.load_transcript_messages(args.session)
        else:
            messages = audit.transcript_at(store.core, args.session, seq=seq, at=at)
    first = 1
    if args.last is not None:
        first = max(1, len(messages) - args.last + 1)
        messages = messages[len(messages) - args.last :] if args.last else []
    if args.json:
        emit_json(messages)
        return EXIT_OK
    if not messages:
        print("no messages")
        return EXIT_OK
    rows = [[first + i, m.role.value, describe_message(m)] for i, m in enumerate(messages)]
    print(table(["#", "ROLE", "CONTENT"], rows, right=(0,), flex=2, full=args.full))
    return EXIT_OK


# -- stats and export ------------------------------------------------------------------


def run_stats(args: argparse.Namespace) -> int:
    """Counts, sizes and times of a session."""
    with (
        open_store(args) as store,
        known_session(store, args.session, shown_root(args), check_first=False),
    ):
        s = audit.stats(store.core, args.session)
    if args.json:
        emit_json(s)
        return EXIT_OK
    print(
        kv(
            [
                ("session", s.session_id),
                ("events", f"{s.events} (seq {s.first_seq}..{s.last_seq})"),
                ("first", fmt_time(s.first_ts)),
                ("last", fmt_time(s.last_ts)),
                (
                    "log",
                    f"{fmt_bytes(s.log_bytes)}, {plural(s.log_events, 'line')},"
                    f" {plural(s.snapshots, 'snapshot')}",
                ),
                ("archive", f"{fmt_bytes(s.archive_bytes)} in {plural(s.archive_files, 'file')}"),
                (
                    "lost",
                    f"{plural(s.compacted_without_archive, 'event')} compacted without an archive",
                ),
            ]
        )
    )
    print()
    print(table(["TYPE", "EVENTS"], sorted(s.by_type.items()), right=(1,)))
    return EXIT_OK


def run_export(args: argparse.Namespace) -> int:
    """One session as a JSON document, its raw events as JSON Lines, or the Claude Code
    lines it imported."""
    if args.format == "claude-code":
        from eventstore.cli.claude_code import run_export as run_claude_code_export

        return run_claude_code_export(args)
    if args.json and args.format == "jsonl":
        raise CliError("--json and --format jsonl ask for different outputs: give one")
    with (
        open_store(args) as store,
        known_session(store, args.session, shown_root(args), check_first=False),
    ):
        if args.format == "jsonl":
            out = sys.stdout.buffer
            for line in audit.export_jsonl(store.core, args.session):
                out.write(line)
            out.flush()
        else:
            emit_json(audit.export_session(store.core, args.session))
    return EXIT_OK
