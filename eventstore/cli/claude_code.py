"""The `eventstore import-claude-code` subcommand and the `claude-code` export format.

Owns the command-line view of `eventstore.integrations.claude_code`:

    eventstore import-claude-code ROOT PATH... [--follow [--interval S] [--idle-exit S]]
    eventstore export ROOT SESSION --format claude-code

`add_parser` registers the import on the `eventstore` command's subparsers and `run`
executes it; `run_export` writes a session's Claude Code lines, byte for byte, for the
`export` command. Skipped lines are reported on stderr as `FILE:LINE: ...`; the exit
status is 1 when a line was skipped or a file could not be read (the rest is imported).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

import msgspec

from eventstore.cli.args import poll_seconds
from eventstore.cli.format import plural, table
from eventstore.cli.store import known_session, shown_root
from eventstore.cli.store import open_store as read_store
from eventstore.engines.base import scheme_of
from eventstore.errors import EventStoreError
from eventstore.integrations.claude_agent_sdk_state import session_of_file
from eventstore.integrations.claude_code import (
    ImportReport,
    export_transcript,
    follow_transcripts,
    import_transcript,
    open_store,
    transcript_files,
)

__all__ = ["add_parser", "missing_store", "run", "run_export"]

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2

_EXAMPLES = """\
examples:
  eventstore import-claude-code .eventstore ~/.claude/projects/-home-me-app
  eventstore import-claude-code .eventstore ~/.claude/projects --follow
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `import-claude-code` on the `eventstore` command's subparsers."""
    p = subparsers.add_parser(
        "import-claude-code",
        help="import Claude Code transcripts (one session per sessionId; idempotent)",
        description=(
            "Import Claude Code JSONL transcripts (files, or directories searched for\n"
            "*.jsonl) into the store at ROOT: one session per Claude Code sessionId, every\n"
            "line kept verbatim (`export --format claude-code` gives it back), messages\n"
            "mirrored into the transcript. Importing again appends nothing. A line that\n"
            "is not a JSON object is reported (FILE:LINE) and skipped."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "root", metavar="ROOT", help="the store: a directory (created if missing) or a URL"
    )
    p.add_argument("paths", metavar="PATH", type=Path, nargs="+", help="files or directories")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep importing as the files grow (Ctrl-C / SIGTERM stop it)",
    )
    p.add_argument(
        "--interval",
        type=poll_seconds,
        default=0.5,
        metavar="S",
        help="with --follow: poll every S s, S >= 0.001",
    )
    p.add_argument(
        "--idle-exit",
        type=float,
        metavar="S",
        help="with --follow: stop once no file has grown for S seconds",
    )
    p.add_argument(
        "--claude-agent-sdk",
        action="store_true",
        help="name sessions as the Claude Agent SDK store does"
        " (claude-sdk.<project dir>.<sessionId>), so it and this import share them",
    )
    p.add_argument("--json", action="store_true", help="print JSON (a list of file reports)")
    p.set_defaults(func=run)


def _row(r: ImportReport, result: str) -> list[object]:
    return [
        result,
        r.lines,
        sum(r.appended.values()),
        sum(r.messages.values()),
        r.already,
        len(r.malformed),
        ", ".join(r.sessions) or "-",
        r.path,
    ]


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT/SIGTERM (the previous handlers are restored afterwards)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals reach only the main thread; the caller stops by other means
        return
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute `eventstore import-claude-code` for parsed `args`; returns the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        store = open_store(args.root)
    except (EventStoreError, OSError) as exc:
        print(f"eventstore import-claude-code: error: {exc}", file=err)
        return EXIT_USAGE
    rows: list[list[object]] = []
    reports: list[tuple[str, ImportReport, str | None]] = []
    session_of = session_of_file if args.claude_agent_sdk else None
    with store:
        if args.follow:

            def progress(r: ImportReport) -> None:
                for m in r.malformed:
                    print(f"eventstore import-claude-code: skipped {m}", file=err)
                if not args.json:
                    new = sum(r.appended.values())
                    print(f"{r.path}: +{r.lines} lines, {new} new", file=out, flush=True)

            with _stop_on_signals() as stop:
                totals = follow_transcripts(
                    store,
                    args.paths,
                    poll_interval=args.interval,
                    stop=stop,
                    idle_timeout=args.idle_exit,
                    on_poll=progress,
                    session_of=session_of,
                )
            reports = [(path, r, None) for path, r in totals.items()]
        else:
            for path in args.paths:
                for f in transcript_files(path):
                    try:
                        r = import_transcript(store, f, session_of=session_of)
                    except (OSError, EventStoreError) as exc:
                        reports.append((str(f), ImportReport(str(f)), str(exc)))
                        print(f"eventstore import-claude-code: error: {f}: {exc}", file=err)
                        continue
                    for m in r.malformed:
                        print(f"eventstore import-claude-code: skipped {m}", file=err)
                    reports.append((str(f), r, None))
    failed = 0
    skipped = 0
    for _, r, error in reports:
        failed += error is not None
        skipped += len(r.malformed)
        result = "failed" if error else ("imported" if sum(r.appended.values()) else "unchanged")
        rows.append(_row(r, result))
    if args.json:
        doc = [
            {
                "file": path,
                "error": error,
                "lines": r.lines,
                "appended": r.appended,
                "messages": r.messages,
                "already": r.already,
                "skipped": [
                    {"line": m.line, "offset": m.offset, "reason": m.reason} for m in r.malformed
                ],
                "not_mirrored": [
                    {"line": m.line, "offset": m.offset, "reason": m.reason} for m in r.unmirrored
                ],
            }
            for path, r, error in reports
        ]
        out.write(msgspec.json.format(msgspec.json.encode(doc), indent=2).decode() + "\n")
    else:
        if rows:
            headers = ["RESULT", "LINES", "NEW", "MESSAGES", "ALREADY", "SKIPPED", "SESSIONS"]
            print(table([*headers, "FILE"], rows, right=(1, 2, 3, 4, 5)), file=out)
        new = sum(sum(r.appended.values()) for _, r, _ in reports)
        print(
            f"\n{plural(len(reports), 'file')}: {plural(new, 'new line')},"
            f" {plural(skipped, 'skipped line')}, {failed} failed",
            file=out,
        )
    return EXIT_PROBLEMS if failed or skipped else EXIT_OK


def missing_store(root: str | os.PathLike[str]) -> bool:
    """Whether ROOT names a store directory that does not exist (a URL of another
    engine is for its engine to judge)."""
    root = os.fspath(root)
    if scheme_of(root) != "file":
        return False
    path = Path(root.removeprefix("file://")) if root.startswith("file://") else Path(root)
    return not path.is_dir()


def run_export(args: argparse.Namespace) -> int:
    """Write session `args.session`'s Claude Code lines to stdout, byte for byte."""
    # a read never creates a store: a directory or schema that is not there is refused
    with read_store(args) as store, known_session(store, args.session, shown_root(args)):
        sink = sys.stdout.buffer
        for line in export_transcript(store, args.session):
            sink.write(line)
        sink.flush()
    return EXIT_OK
