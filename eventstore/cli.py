"""The `eventstore` command: demo, audit, replay, compaction and import of legacy files.

Every subcommand only formats what a library function returns (`eventstore.audit`,
`eventstore.legacy`, `SessionStore`): there is one core, and the command is a view of it.
Output is an aligned table by default and JSON with `--json`. Exit codes: 0 ok; 1
problems found (verify) or some sessions failed (compact, import-legacy); 2 usage
errors, a missing store root, an unknown session, a corrupt log, history not available.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import signal
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, NoReturn

import msgspec

from . import audit
from .errors import EventStoreError
from .events import Event, event_tag
from .records import (
    BootstrapState,
    FeatureRecord,
    InitCommand,
    InitPlan,
    InitShell,
    InitShellScript,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
)
from .store import SessionStore
from .transcript_format import describe_message

__all__ = ["main"]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

PROG = "eventstore"

EPILOG = """\
examples:
  eventstore demo                              write a demo session under ./.eventstore
  eventstore sessions .eventstore              list the sessions of a store
  eventstore state .eventstore demo --at-seq 30
  eventstore log .eventstore demo --type feature_pass_updated --since 2026-11-29T10:00
  eventstore verify .eventstore --all          check every session (exit 1 on a problem)
  eventstore compact .eventstore --all --min-bytes 1000000
  eventstore follow .eventstore demo --json    like tail -f, one JSON object per event

exit codes:
  0  ok
  1  problems found (verify), or some sessions failed (compact, import-legacy)
  2  usage error, missing store root, unknown session, corrupt log

Times are shown in UTC; --at-time/--since/--until take ISO 8601 (no offset: UTC).
Every subcommand takes --json; `log` and `follow` then print one JSON object per line.
"""


class CliError(Exception):
    """A one-line error for stderr; exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# -- formatting ------------------------------------------------------------------------


def _width() -> int:
    return shutil.get_terminal_size((120, 24)).columns


def fmt_time(ts: datetime | None) -> str:
    """A readable UTC time: `2026-11-29 15:40:00Z`."""
    if ts is None:
        return "-"
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_bytes(n: int) -> str:
    """`1.2 MB`-style sizes (powers of 1000, like `ls --si`)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def shorten(text: str, width: int, full: bool) -> str:
    """One line; cut to `width` with an ellipsis unless `full`."""
    if full:
        return text
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def display_width(text: str) -> int:
    """Columns `text` takes on a terminal (East Asian wide characters take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], right: Iterable[int] = ()
) -> str:
    """An aligned plain-text table (the last column is never padded)."""
    cells = [[str(c) for c in r] for r in rows]
    cols = len(headers)
    widths = [display_width(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], display_width(c))
    rset = set(right)

    def line(row: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(row):
            pad = " " * (widths[i] - display_width(c))
            if i in rset:
                out.append(pad + c)
            else:
                out.append(c if i == cols - 1 else c + pad)
        return "  ".join(out).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def kv(pairs: Iterable[tuple[str, object]]) -> str:
    """Aligned `key  value` lines."""
    items = list(pairs)
    w = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in items)


def emit_json(obj: Any) -> None:
    """Pretty JSON of builtins or msgspec Structs (datetimes as ISO 8601) on stdout."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode() + "\n")


def emit_json_line(obj: Any) -> None:
    """One JSON object on its own line, flushed (for `log --json` and `follow --json`)."""
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
    sys.stdout.flush()


def parse_time(text: str) -> datetime:
    """ISO 8601 (`2026-11-29T15:40`, `...Z`, `...+01:00`); no offset means UTC."""
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def _nonneg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {n}")
    return n


# -- opening stores and sessions -------------------------------------------------------


def open_store(root: Path, *, create: bool = False) -> SessionStore:
    """The store at `root`; CliError if it does not exist (unless `create`)."""
    if not create and not root.is_dir():
        raise CliError(f"no store at {root} (directory not found)")
    return SessionStore(root)


def need_session(store: SessionStore, session_id: str) -> None:
    """CliError unless the session has a log or an archive in the store."""
    try:
        files = audit.history_files(store, session_id)
    except ValueError as exc:  # InvalidSessionIdError
        raise CliError(str(exc)) from None
    if not files:
        raise CliError(
            f"unknown session {session_id!r} in {store.root} (see: eventstore sessions ROOT)"
        )


# -- state rendering -------------------------------------------------------------------


def render_state(session_id: str, state: BootstrapState, full: bool, where: str) -> str:
    """The bootstrap state as readable sections."""
    width = _width()
    out: list[str] = []
    m = state.manifest
    if m is None:
        out.append(f"session {session_id} ({where}): no manifest yet")
    else:
        steps: list[str] = []
        for i, step in enumerate(m.init_plan.steps if m.init_plan else [], 1):
            if isinstance(step, InitCommand):
                steps.append(f"{i}. command  {' '.join([step.program, *step.args])}")
            else:
                script = shorten(step.script, width - 30, full)
                steps.append(f"{i}. {step.shell.value:<7}  {script}")
        meta = ", ".join(f"{k}={v}" for k, v in m.metadata.items()) or "-"
        out.append(
            kv(
                [
                    ("session", f"{session_id} ({where})"),
                    ("objective", shorten(m.current_objective, width - 20, full)),
                    ("branch", m.active_branch),
                    ("last good commit", m.last_known_good_commit or "-"),
                    ("harness", f"{m.harness_version} (schema {m.schema_version})"),
                    ("metadata", meta),
                    ("init plan", ("\n" + " " * 18).join(steps) or "-"),
                ]
            )
        )
    fl = state.feature_list
    passing = sum(1 for f in fl if f.passes)
    out.append(f"\nfeatures: {passing}/{len(fl)} passing")
    if fl:
        out.append(
            table(
                ["ID", "CATEGORY", "PASSES", "DESCRIPTION"],
                [
                    [
                        f.id,
                        f.category,
                        "yes" if f.passes else "no",
                        shorten(f.description, 60, full),
                    ]
                    for f in fl
                ],
            )
        )
    out.append(f"\nprogress: {len(state.recent_progress)} entries")
    if state.recent_progress:
        out.append(
            table(
                ["TIME", "RUN", "SUMMARY"],
                [
                    [fmt_time(p.created_at), p.run_id, shorten(p.summary, width - 40, full)]
                    for p in state.recent_progress
                ],
            )
        )
    out.append(f"\ncheckpoints: {len(state.checkpoints)}")
    if state.checkpoints:
        out.append(
            table(
                ["RUN", "STATUS", "STARTED", "COMPLETED", "NOTE"],
                [
                    [
                        c.run_id,
                        c.status.value,
                        fmt_time(c.started_at),
                        fmt_time(c.completed_at),
                        shorten(c.note or "-", 40, full),
                    ]
                    for c in state.checkpoints
                ],
            )
        )
    return "\n".join(out)


def event_rows(events: Iterable[Event], full: bool) -> Iterable[list[str]]:
    """SEQ, TIME, TYPE, SUMMARY for each event."""
    width = max(40, _width() - 60)
    for ev in events:
        yield [
            str(ev.seq),
            fmt_time(ev.ts),
            _tag(ev),
            shorten(audit.event_summary(ev), width, full),
        ]


def _tag(ev: Event) -> str:
    name = getattr(ev, "type_name", None)
    return str(name) if name else event_tag(type(ev))


# -- subcommands -----------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """Write (or continue) a realistic harness session and print its bootstrap state."""
    store = open_store(args.root, create=True)
    with store:
        sid = args.session
        created = write_demo(store, sid)
        state = store.load_bootstrap_state(sid)
        last = store.last_seq(sid)
        if args.json:
            emit_json(
                {
                    "session_id": sid,
                    "root": str(args.root),
                    "created": created,
                    "last_seq": last,
                    "state": state,
                }
            )
            return EXIT_OK
        verb = "wrote a new" if created else "continued the"
        print(f"{verb} demo session {sid!r} in {args.root} ({last} events)\n")
        print(render_state(sid, state, args.full, f"seq {last}"))
        print(f"\nnext: eventstore log {args.root} {sid}  |  eventstore verify {args.root} {sid}")
    return EXIT_OK


DEMO_FEATURES = [
    ("auth-001", "auth", "A visitor can sign up with email and password"),
    ("auth-002", "auth", "A user can log in and log out"),
    ("auth-003", "auth", "A wrong password shows an error and no session is created"),
    ("todo-001", "todos", "A user can add a todo with a title"),
    ("todo-002", "todos", "A user can mark a todo done and undone"),
    ("todo-003", "todos", "A user can edit a todo's title inline"),
    ("todo-004", "todos", "A user can delete a todo, with undo for five seconds"),
    ("todo-005", "todos", "Todos persist across page reloads"),
    ("list-001", "lists", "A user can create named lists"),
    ("list-002", "lists", "A user can move a todo between lists"),
    ("list-003", "lists", "Deleting a list asks for confirmation"),
    ("ui-001", "ui", "The empty state explains how to add the first todo"),
    ("ui-002", "ui", "Keyboard shortcuts: n (new), e (edit), x (done)"),
    ("ui-003", "ui", "The layout works at 360 px width"),
    ("ui-004", "ui", "Dark mode follows the system setting"),
    ("api-001", "api", "GET /api/todos returns the user's todos as JSON"),
    ("api-002", "api", "POST /api/todos validates the title (1..200 chars)"),
    ("api-003", "api", "The API answers 401 without a session cookie"),
    ("perf-001", "performance", "The first page renders in under one second on 3G"),
    ("a11y-001", "accessibility", "Every control has an accessible name (axe: 0 violations)"),
]


def write_demo(store: SessionStore, sid: str) -> bool:
    """Run the demo harness against `sid`: initialize (True) or add one more run (False)."""
    # a run of about 35 minutes that ends now: realistic, never-future record times
    now = datetime.now(UTC) - timedelta(minutes=35)
    features = [
        FeatureRecord(
            id=i, category=c, description=d, steps=["open the app", f"check: {d}"], passes=False
        )
        for i, c, d in DEMO_FEATURES
    ]
    manifest = SessionManifest(
        session_id=sid,
        active_branch="feature/todo-mvp",
        current_objective="Build the todo web app MVP: every feature in the list passes end to end",
        last_known_good_commit=None,
        init_plan=InitPlan(
            steps=[
                InitCommand(program="npm", args=["ci"]),
                InitShellScript(shell=InitShell.BASH, script="npm run db:migrate && npm run build"),
                InitCommand(program="npx", args=["playwright", "install", "chromium"]),
            ]
        ),
        metadata={"repo": "github.com/example/todo", "model": "demo-agent-1"},
    )
    created = store.initialize_session_if_missing(
        sid,
        manifest,
        features,
        initial_progress_entry=ProgressEntry(
            run_id="run-1",
            summary="Initializer: wrote the feature list and init.sh",
            created_at=now,
        ),
        initial_checkpoint=RunCheckpoint(run_id="run-1", started_at=now),
    )
    state = store.load_bootstrap_state(sid)
    run = len({c.run_id for c in state.checkpoints}) + (0 if created else 1)
    run_id = f"run-{run}"
    if not created:
        store.record_run_checkpoint(sid, RunCheckpoint(run_id=run_id, started_at=now))
        store.append_progress_entry(
            sid,
            ProgressEntry(
                run_id=run_id, summary="Resumed from the bootstrap state", created_at=now
            ),
        )
    store.append_transcript_messages(
        sid,
        [
            Message(
                role=Role.SYSTEM, content="You are a coding agent. Work on one feature at a time."
            ),
            Message(
                role=Role.USER,
                content=f"Continue the todo app ({run_id}). Read the progress notes first.",
            ),
        ],
    )
    todo = [f for f in store.load_bootstrap_state(sid).feature_list if not f.passes]
    for k, feature in enumerate(todo[:4]):
        t = now + timedelta(minutes=7 * (k + 1))
        store.append_transcript_messages(
            sid,
            [
                Message(
                    role=Role.ASSISTANT,
                    content=f"Implementing {feature.id}: {feature.description}.",
                ),
                Message(
                    role=Role.TOOL, content=f"$ npx playwright test {feature.id}\n1 passed (2.1s)"
                ),
            ],
        )
        store.update_feature_pass(sid, feature.id, True)
        store.append_progress_entry(
            sid,
            ProgressEntry(
                run_id=run_id, summary=f"{feature.id} passes end to end; committed", created_at=t
            ),
        )
    end = now + timedelta(minutes=35)
    if todo[4:]:
        store.append_progress_entry(
            sid,
            ProgressEntry(
                run_id=run_id,
                summary=f"{todo[4].id} started; flaky selector, left for the next run",
                created_at=end,
            ),
        )
    manifest = store.load_bootstrap_state(sid).manifest or manifest
    store.save_manifest(
        sid, msgspec.structs.replace(manifest, last_known_good_commit=f"{0x3F9C2AB + run:07x}")
    )
    store.record_run_checkpoint(
        sid,
        RunCheckpoint(
            run_id=run_id,
            started_at=now,
            completed_at=end,
            status=RunStatus.SUCCEEDED if todo[4:] or not todo else RunStatus.FAILED,
            note=f"{min(4, len(todo))} features flipped to passing",
        ),
    )
    store.append_transcript_messages(
        sid, [Message(role=Role.ASSISTANT, content=f"Done with {run_id}; progress notes updated.")]
    )
    return created


def cmd_sessions(args: argparse.Namespace) -> int:
    """List a store's sessions."""
    with open_store(args.root) as store:
        rows: list[dict[str, Any]] = []
        for sid in store.list_sessions():
            files = audit.history_files(store, sid)
            live = [f for f in files if not f.archived]
            st = os.stat(live[0].path) if live else None
            rows.append(
                {
                    "session_id": sid,
                    "last_seq": store.last_seq(sid) if live else 0,
                    "log_bytes": st.st_size if st else 0,
                    "archive_files": sum(1 for f in files if f.archived),
                    "updated": datetime.fromtimestamp(st.st_mtime, UTC) if st else None,
                }
            )
        if args.json:
            emit_json(rows)
            return EXIT_OK
        if not rows:
            print(f"no sessions in {args.root}")
            return EXIT_OK
        print(
            table(
                ["SESSION", "LAST SEQ", "LOG", "ARCHIVED", "UPDATED"],
                [
                    [
                        r["session_id"],
                        r["last_seq"],
                        fmt_bytes(r["log_bytes"]),
                        r["archive_files"],
                        fmt_time(r["updated"]),
                    ]
                    for r in rows
                ],
                right=(1, 2, 3),
            )
        )
    return EXIT_OK


def cmd_log(args: argparse.Namespace) -> int:
    """The session's events, one per line."""
    with open_store(args.root) as store:
        need_session(store, args.session)
        events: Iterable[Event] = audit.read_events(
            store, args.session, from_seq=args.from_seq, to_seq=args.to_seq, types=args.type
        )
        if args.since or args.until:
            since, until = args.since, args.until
            events = (
                e
                for e in events
                if (since is None or e.ts >= since) and (until is None or e.ts <= until)
            )
        if args.json:
            for ev in events:
                emit_json_line(audit.event_to_json(ev))
            return EXIT_OK
        rows = list(event_rows(events, args.full))
        if not rows:
            print("no events match")
            return EXIT_OK
        print(table(["SEQ", "TIME", "TYPE", "SUMMARY"], rows, right=(0,)))
    return EXIT_OK


def _as_of(
    args: argparse.Namespace, store: SessionStore
) -> tuple[int | None, datetime | None, str]:
    if args.at_seq is not None:
        return args.at_seq, None, f"as of seq {args.at_seq}"
    if args.at_time is not None:
        return None, args.at_time, f"as of {fmt_time(args.at_time)}"
    return None, None, f"seq {store.last_seq(args.session)}, current"


def cmd_state(args: argparse.Namespace) -> int:
    """The bootstrap state, now or as of a sequence number or a time."""
    with open_store(args.root) as store:
        need_session(store, args.session)
        seq, at, where = _as_of(args, store)
        if seq is None and at is None:
            state = store.load_bootstrap_state(args.session)
        else:
            state = audit.state_at(store, args.session, seq=seq, at=at)
        if args.json:
            emit_json(state)
        else:
            print(render_state(args.session, state, args.full, where))
    return EXIT_OK


def cmd_transcript(args: argparse.Namespace) -> int:
    """The transcript (its last N messages with --last)."""
    with open_store(args.root) as store:
        need_session(store, args.session)
        seq, at, _ = _as_of(args, store)
        if seq is None and at is None:
            messages = store.load_transcript_messages(args.session)
        else:
            messages = audit.transcript_at(store, args.session, seq=seq, at=at)
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
        width = max(30, _width() - 18)
        print(
            table(
                ["#", "ROLE", "CONTENT"],
                [
                    [first + i, m.role.value, shorten(describe_message(m), width, args.full)]
                    for i, m in enumerate(messages)
                ],
                right=(0,),
            )
        )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify one session or all; exit 1 if any has an error."""
    with open_store(args.root) as store:
        if args.all:
            if args.session:
                raise CliError("give a SESSION or --all, not both")
            ids = store.list_sessions()
        elif args.session:
            need_session(store, args.session)
            ids = [args.session]
        else:
            raise CliError("give a SESSION or --all")
        reports = []
        for sid in ids:
            try:
                reports.append(audit.verify(store, sid))
            except EventStoreError as exc:
                reports.append(
                    audit.VerifyReport(
                        sid,
                        False,
                        [audit.Problem("", 0, None, "unreadable", str(exc))],
                        "",
                        0,
                        0,
                        [],
                    )
                )
        ok = all(r.ok for r in reports)
        if args.json:
            emit_json(reports[0] if not args.all else {"ok": ok, "sessions": reports})
            return EXIT_OK if ok else EXIT_PROBLEMS
        width = max(40, _width() - 70)
        for r in reports:
            errors = sum(1 for p in r.problems if p.severity == "error")
            warnings = len(r.problems) - errors
            status = "ok" if r.ok else "FAILED"
            print(
                f"{status:<6}  {r.session_id}  events={r.events}  head={r.head_hash or '-'}"
                f"  files={len(r.files)}  errors={errors}  warnings={warnings}"
            )
            if r.problems:
                print(
                    table(
                        ["  SEVERITY", "FILE", "OFFSET", "SEQ", "KIND", "MESSAGE"],
                        [
                            [
                                "  " + p.severity,
                                _rel(p.file, args.root),
                                p.offset,
                                "-" if p.seq is None else p.seq,
                                p.kind,
                                shorten(p.message, width, args.full),
                            ]
                            for p in r.problems
                        ],
                        right=(2, 3),
                    )
                )
        if len(reports) > 1:
            bad = sum(1 for r in reports if not r.ok)
            print(f"\n{len(reports)} sessions verified, {bad} with errors")
    return EXIT_OK if ok else EXIT_PROBLEMS


def _rel(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def cmd_follow(args: argparse.Namespace) -> int:
    """Print events as they are appended until SIGINT/SIGTERM."""
    with open_store(args.root) as store:
        need_session(store, args.session)
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        from_seq = args.from_seq
        if from_seq is None:  # like tail -f: the last 10, then what comes
            from_seq = max(1, store.last_seq(args.session) - 9)
        for ev in audit.follow(
            store, args.session, from_seq=from_seq, poll_interval=args.interval, stop=stop
        ):
            if args.json:
                emit_json_line(audit.event_to_json(ev))
            else:
                row = next(iter(event_rows([ev], args.full)))
                sys.stdout.write(f"{row[0]:>6}  {row[1]}  {row[2]:<21}  {row[3]}\n")
                sys.stdout.flush()
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    """Counts, sizes and times of a session."""
    with open_store(args.root) as store:
        need_session(store, args.session)
        s = audit.stats(store, args.session)
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
                        f"{fmt_bytes(s.log_bytes)}, {s.log_events} lines,"
                        f" {s.snapshots} snapshot(s)",
                    ),
                    ("archive", f"{fmt_bytes(s.archive_bytes)} in {s.archive_files} file(s)"),
                    ("lost", f"{s.compacted_without_archive} events compacted without an archive"),
                ]
            )
        )
        print()
        print(table(["TYPE", "EVENTS"], sorted(s.by_type.items()), right=(1,)))
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """One session as a JSON document, or its raw events as JSON Lines."""
    if args.format == "claude-code":
        return importlib.import_module("eventstore.cli_claude_code").run_export(args)  # type: ignore[no-any-return]
    with open_store(args.root) as store:
        need_session(store, args.session)
        fmt = "json" if args.json else args.format
        if fmt == "jsonl":
            out = sys.stdout.buffer
            for line in audit.export_jsonl(store, args.session):
                out.write(line)
            out.flush()
        else:
            emit_json(audit.export_session(store, args.session))
    return EXIT_OK


def cmd_import_legacy(args: argparse.Namespace) -> int:
    """Import the older design's per-session JSON state files."""
    from . import legacy

    if not args.legacy_dir.is_dir():
        raise CliError(f"no legacy directory at {args.legacy_dir}")
    with open_store(args.root, create=True) as store:
        report = legacy.import_legacy(store, args.legacy_dir)
        if args.json:
            emit_json(report)
        else:
            if report.items:
                print(
                    table(
                        ["RESULT", "SESSION", "EVENTS", "FILE", "DETAIL"],
                        [
                            [
                                i.result,
                                i.session_id or "-",
                                i.events,
                                Path(i.file).name,
                                shorten(i.detail, 60, args.full),
                            ]
                            for i in report.items
                        ],
                        right=(2,),
                    )
                )
            print(
                f"\n{report.imported} imported, {report.skipped} skipped, {report.failed} failed"
                f" ({len(report.items)} files in {args.legacy_dir})"
            )
    return EXIT_PROBLEMS if report.failed else EXIT_OK


def cmd_repair(args: argparse.Namespace) -> int:
    """Truncate a torn tail, or keep the valid prefix and move the corrupt log aside."""
    with open_store(args.root) as store:
        need_session(store, args.session)
        r = audit.repair(store, args.session)
        if args.json:
            emit_json(r)
            return EXIT_OK
        print(
            kv(
                [
                    ("session", r.session_id),
                    ("action", r.action),
                    ("log", _rel(r.log, args.root)),
                    ("kept", f"{r.kept_events} events, {fmt_bytes(r.kept_bytes)}"),
                    ("dropped", fmt_bytes(r.dropped_bytes)),
                    ("moved aside to", _rel(r.moved_to, args.root) if r.moved_to else "-"),
                    ("why", r.message),
                ]
            )
        )
    return EXIT_OK


class _Progress:
    """A one-line progress bar on a terminal (stderr); nothing otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled and total > 0

    def update(self, done: int, label: str) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // self.total
        label = shorten(label, 30, False)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {label:<30}"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 80 + "\r")
            sys.stderr.flush()


def cmd_compact(args: argparse.Namespace) -> int:
    """Compact many sessions; one failure never stops the rest."""
    try:
        importlib.import_module("eventstore.compaction")
    except ImportError:
        raise CliError("compaction is not available in this installation") from None
    t0 = time.perf_counter()
    with open_store(args.root) as store:
        if args.all and args.sessions:
            raise CliError("give SESSION names or --all, not both")
        if not args.all and not args.sessions:
            raise CliError("give SESSION names or --all")
        ids = store.list_sessions() if args.all else list(args.sessions)
        results: list[dict[str, Any]] = []
        bar = _Progress(len(ids), sys.stderr.isatty() and not args.json)
        for n, sid in enumerate(ids, 1):
            bar.update(n - 1, sid)
            res = _compact_one(store, sid, args)
            results.append(res)
            if not bar.enabled and not args.json:
                print(_compact_line(res))
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
            if bar.enabled:
                for r in results:
                    if r["result"] == "failed":
                        print(_compact_line(r))
            verb = "would compact" if args.dry_run else "compacted"
            print(
                f"{summary['compacted']} {verb}, {summary['skipped']} skipped,"
                f" {summary['failed']} failed;"
                f" {fmt_bytes(summary['bytes_before'])} -> {fmt_bytes(summary['bytes_after'])}"
                f" in {summary['seconds']:.2f} s"
            )
    return EXIT_PROBLEMS if summary["failed"] else EXIT_OK


def _compact_one(store: SessionStore, sid: str, args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {
        "session_id": sid,
        "result": "failed",
        "bytes_before": 0,
        "bytes_after": 0,
        "events_before": 0,
        "events_after": 0,
        "archive_path": None,
        "detail": "",
    }
    try:
        files = audit.history_files(store, sid)
        live = [f for f in files if not f.archived]
        if not live:
            raise audit.UnknownSessionError(f"unknown session {sid!r}")
        data = live[0].path.read_bytes()
        size, lines = len(data), data.count(b"\n")
        res.update(bytes_before=size, bytes_after=size, events_before=lines, events_after=lines)
        if size < args.min_bytes or lines < args.min_events:
            res.update(
                result="skipped", detail=f"below the threshold ({fmt_bytes(size)}, {lines} lines)"
            )
            return res
        if args.dry_run:
            res.update(result="would compact", detail=f"{fmt_bytes(size)}, {lines} lines")
            return res
        rep = store.compact(sid, archive=not args.no_archive)
        if not getattr(rep, "compacted", True):
            res.update(result="skipped", detail="already compact")
            importlib.import_module("eventstore.cli_lifecycle").prune_after_compact(
                store, sid, args, res
            )
            return res
        res.update(
            result="compacted",
            bytes_before=rep.bytes_before,
            bytes_after=rep.bytes_after,
            events_before=rep.events_before,
            events_after=rep.events_after,
            archive_path=str(rep.archive_path) if rep.archive_path else None,
            detail=f"seq {rep.first_seq}..{rep.last_seq} in {rep.seconds:.3f} s",
        )
        importlib.import_module("eventstore.cli_lifecycle").prune_after_compact(
            store, sid, args, res
        )
    except (EventStoreError, OSError, ValueError) as exc:
        res.update(result="failed", detail=_one_line(exc))
    return res


def _compact_line(r: dict[str, Any]) -> str:
    sizes = f"{fmt_bytes(r['bytes_before'])} -> {fmt_bytes(r['bytes_after'])}"
    if r["result"] == "compacted":
        lines = f"{r['events_before']} -> {r['events_after']} lines"
        return f"compacted      {r['session_id']}: {sizes}, {lines} ({r['detail']})"
    return f"{r['result']:<14} {r['session_id']}: {r['detail']}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- the parser ------------------------------------------------------------------------


def _contexts_module() -> ModuleType | None:
    # `contexts` lives in its own module; an installation without it omits the command
    try:
        return importlib.import_module("eventstore.cli_contexts")
    except ImportError:
        return None


def build_parser() -> argparse.ArgumentParser:
    """The `eventstore` argument parser (every subcommand, with examples)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Audit, replay, compact and import eventstore session logs.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help_: str, examples: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog="examples:\n" + examples,
            formatter_class=fmt,
        )
        p.set_defaults(func=func)
        p.add_argument("--json", action="store_true", help="print JSON for machines")
        return p

    def root(p: argparse.ArgumentParser) -> None:
        p.add_argument("root", metavar="ROOT", type=Path, help="the store root directory")

    def session(p: argparse.ArgumentParser) -> None:
        root(p)
        p.add_argument("session", metavar="SESSION", help="the session id")

    def full(p: argparse.ArgumentParser) -> None:
        p.add_argument("--full", action="store_true", help="show long text in full")

    def as_of(p: argparse.ArgumentParser) -> None:
        g = p.add_mutually_exclusive_group()
        g.add_argument("--at-seq", type=_nonneg, metavar="N", help="as of sequence number N")
        g.add_argument("--at-time", type=parse_time, metavar="T", help="as of time T (ISO 8601)")

    p = add(
        "demo",
        cmd_demo,
        "write a realistic harness session and print its state",
        "  eventstore demo\n  eventstore demo --root /tmp/store --session demo-2",
    )
    p.add_argument(
        "--root", type=Path, default=Path(".eventstore"), help="store root (default ./.eventstore)"
    )
    p.add_argument(
        "--session", default="demo", help="session id (default: demo); rerun to add a run"
    )
    full(p)

    p = add(
        "sessions",
        cmd_sessions,
        "list the sessions of a store",
        "  eventstore sessions .eventstore",
    )
    root(p)

    p = add(
        "log",
        cmd_log,
        "show a session's events, one per line",
        "  eventstore log .eventstore demo\n"
        "  eventstore log .eventstore demo --type progress_appended --type checkpoint_recorded\n"
        "  eventstore log .eventstore demo --from-seq 10 --to-seq 20 --full\n"
        "  eventstore log .eventstore demo --since 2026-11-29T15:00 --json | jq .type",
    )
    session(p)
    p.add_argument(
        "--type", action="append", metavar="TYPE", help="only events of TYPE (repeatable)"
    )
    p.add_argument("--from-seq", type=_nonneg, default=1, metavar="N", help="first sequence number")
    p.add_argument("--to-seq", type=_nonneg, metavar="N", help="last sequence number")
    p.add_argument("--since", type=parse_time, metavar="T", help="appended at or after T")
    p.add_argument("--until", type=parse_time, metavar="T", help="appended at or before T")
    full(p)

    p = add(
        "state",
        cmd_state,
        "show the bootstrap state (now, or as of a seq or a time)",
        "  eventstore state .eventstore demo\n  eventstore state .eventstore demo --at-seq 12\n"
        "  eventstore state .eventstore demo --at-time 2026-11-29T15:40:00Z --json",
    )
    session(p)
    as_of(p)
    full(p)

    p = add(
        "transcript",
        cmd_transcript,
        "show the transcript (now, or as of a seq or a time)",
        "  eventstore transcript .eventstore demo --last 5\n"
        "  eventstore transcript .eventstore demo --full",
    )
    session(p)
    p.add_argument("--last", type=_nonneg, metavar="N", help="only the last N messages")
    as_of(p)
    full(p)

    p = add(
        "verify",
        cmd_verify,
        "check hash links, sequence, decoding and batches (exit 1 on a problem)",
        "  eventstore verify .eventstore demo\n  eventstore verify .eventstore --all --json",
    )
    root(p)
    p.add_argument("session", metavar="SESSION", nargs="?", help="the session id")
    p.add_argument("--all", action="store_true", help="verify every session")
    full(p)

    p = add(
        "follow",
        cmd_follow,
        "print events as they are appended (like tail -f; Ctrl-C stops)",
        "  eventstore follow .eventstore demo\n"
        "  eventstore follow .eventstore demo --from-seq 1 --json",
    )
    session(p)
    p.add_argument(
        "--from-seq", type=_nonneg, metavar="N", help="start at N (default: the last 10 events)"
    )
    p.add_argument(
        "--interval", type=float, default=0.2, metavar="S", help="poll every S seconds (0.2)"
    )
    full(p)

    p = add(
        "stats",
        cmd_stats,
        "events per type, bytes, first/last time, archive size",
        "  eventstore stats .eventstore demo",
    )
    session(p)

    p = add(
        "export",
        cmd_export,
        "export a session as JSON (its state) or JSONL (its raw events)",
        "  eventstore export .eventstore demo > demo.json\n"
        "  eventstore export .eventstore demo --format jsonl | jq -c '{seq, type}'",
    )
    session(p)
    p.add_argument(
        "--format",
        choices=("json", "jsonl", "claude-code"),
        default="json",
        help="json (default), jsonl, or claude-code (the imported Claude Code lines)",
    )

    p = add(
        "import-legacy",
        cmd_import_legacy,
        "import the older design's per-session JSON files",
        "  eventstore import-legacy .eventstore /var/lib/harness/state",
    )
    root(p)
    p.add_argument(
        "legacy_dir", metavar="LEGACY_DIR", type=Path, help="holds sessions/<hex id>.json"
    )
    full(p)

    p = add(
        "repair",
        cmd_repair,
        "truncate a torn tail, or keep the valid prefix and move a corrupt log aside",
        "  eventstore repair .eventstore demo",
    )
    session(p)

    p = add(
        "compact",
        cmd_compact,
        "compact sessions into snapshots (safe beside live writers)",
        "  eventstore compact .eventstore --all\n"
        "  eventstore compact .eventstore demo other --no-archive\n"
        "  eventstore compact .eventstore --all --min-bytes 1000000 --dry-run --json",
    )
    root(p)
    p.add_argument("sessions", metavar="SESSION", nargs="*", help="sessions to compact")
    p.add_argument("--all", action="store_true", help="every session of the store")
    p.add_argument(
        "--min-bytes", type=_nonneg, default=0, metavar="N", help="skip logs smaller than N bytes"
    )
    p.add_argument(
        "--min-events", type=_nonneg, default=0, metavar="N", help="skip logs of fewer than N lines"
    )
    p.add_argument(
        "--no-archive", action="store_true", help="do not keep the old log in the archive"
    )
    p.add_argument("--dry-run", action="store_true", help="show what would be compacted")
    importlib.import_module("eventstore.cli_lifecycle").add_prune_option(p)

    contexts = _contexts_module()
    if contexts is not None:
        contexts.add_parser(sub)
    importlib.import_module("eventstore.cli_claude_code").add_parser(sub)
    importlib.import_module("eventstore.cli_lifecycle").add_parser(sub)
    importlib.import_module("eventstore.cli_postgres").add_parser(sub)  # init-db, migrate
    from . import cli_report

    cli_report.add_parser(sub)
    return parser


def _fail(message: str, code: int) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except CliError as exc:
        _fail(str(exc), exc.code)
    except audit.UnknownSessionError as exc:
        _fail(str(exc), EXIT_USAGE)
    except audit.HistoryUnavailableError as exc:
        _fail(str(exc), EXIT_USAGE)
    except EventStoreError as exc:  # a corrupt log, an unsafe path, a bad id
        _fail(_one_line(exc), EXIT_USAGE)
    except ValueError as exc:
        _fail(_one_line(exc), EXIT_USAGE)
    except BrokenPipeError:
        # the reader (head, less) went away: not an error; silence the flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        _fail(_one_line(exc), EXIT_USAGE)
