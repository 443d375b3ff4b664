"""The `eventstore init-db URL` and `eventstore migrate SRC DST` subcommands.

`init-db` creates (or migrates) the PostgreSQL engine's schema, for a deployment where
an administrator creates it once and the application role only reads and writes.
`migrate` copies sessions between any two stores (a path, `file://`, `memory://`,
`postgresql://`) with `eventstore.ops.migrate`: history included, byte for byte, idempotent
(a second run copies nothing; an interrupted one continues), with progress on stderr,
then checks that both sides hold the same bytes and verify clean.

A URL is printed only with its password redacted. `add_parser` registers both commands
on the `eventstore` command's subparsers; `run` executes one and returns the exit status.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import msgspec

from eventstore.cli.format import one_line
from eventstore.cli.store import store_at
from eventstore.engines.postgres.url import (
    redact_url,
    split_url,
)
from eventstore.errors import EventStoreError
from eventstore.ops.migrate import (
    MigrationResult,
    migrate_session,
    same_history,
)
from eventstore.store import SessionStore

__all__ = ["add_parser", "run"]

EXIT_OK = 0
EXIT_FAILED = 1  # a session could not be copied, or the copies differ or fail verify
EXIT_USAGE = 2

_INIT_EXAMPLES = """\
examples:
  eventstore init-db postgresql://admin@db.internal/harness
  eventstore init-db 'postgresql://admin@db.internal/harness?schema=team_a'
"""

_MIGRATE_EXAMPLES = """\
examples:
  eventstore migrate .eventstore postgresql://app@db.internal/harness --all
  eventstore migrate postgresql://app@db.internal/harness ./backup demo other
  eventstore migrate .eventstore postgresql://app@db/h --all --json | jq '.[]'
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `init-db` and `migrate` on the `eventstore` command's subparsers."""
    p = subparsers.add_parser(
        "init-db",
        help="create or upgrade the PostgreSQL engine's schema",
        description=(
            "Create the PostgreSQL engine's schema (tables and functions) in the database\n"
            "URL names, or bring it to this version. Safe to run again and concurrently."
        ),
        epilog=_INIT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", metavar="URL", help="postgresql://user[:password]@host[:port]/db")
    p.set_defaults(func=run, pg_command="init-db")

    p = subparsers.add_parser(
        "migrate",
        help="copy sessions between two stores (any engines), history included",
        description=(
            "Copy sessions from SRC to DST (a path, file://, memory:// or postgresql://),\n"
            "every line byte for byte with its archived history, so hash chains and\n"
            "verify hold on both sides. Idempotent: sessions already copied are skipped,\n"
            "an interrupted copy continues. Progress goes to stderr."
        ),
        epilog=_MIGRATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="the store to copy from")
    p.add_argument("dst", metavar="DST", help="the store to copy to")
    p.add_argument("sessions", metavar="SESSION", nargs="*", help="sessions to copy")
    p.add_argument("--all", action="store_true", help="every session of SRC")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run, pg_command="migrate")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute `init-db` or `migrate` for parsed `args`; returns the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if args.pg_command == "init-db":
        return _init_db(args, out, err)
    return _migrate(args, out, err)


def _init_db(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    url: str = args.url
    try:
        from eventstore.engines.postgres.engine import init_db
    except ImportError as exc:
        print(f"eventstore init-db: error: {exc}", file=err)
        return EXIT_USAGE
    try:
        _, schema = split_url(url)
        before, now = init_db(url)
    except ValueError as exc:
        print(f"eventstore init-db: error: {one_line(str(exc))}", file=err)
        return EXIT_USAGE
    except EventStoreError as exc:
        print(f"eventstore init-db: error: {one_line(str(exc))}", file=err)
        return EXIT_FAILED
    if before == now:
        what = f"already at version {now}"
    elif before == 0:
        what = f"created at version {now}"
    else:
        what = f"upgraded from version {before} to {now}"
    print(f"{redact_url(url)}: schema {schema!r} {what}", file=out)
    return EXIT_OK


def _open(url: str, err: TextIO, *, create: bool) -> SessionStore | None:
    """The store `url` names (`create`: False for the source, which is only read, so a
    mistyped one is an error rather than an empty store made there)."""
    try:
        return store_at(url, create=create)
    except (EventStoreError, ValueError, OSError) as exc:
        print(f"eventstore migrate: error: {redact_url(url)}: {one_line(str(exc))}", file=err)
        return None


def _migrate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.all == bool(args.sessions):
        print("eventstore migrate: error: name SESSIONs or give --all (not both)", file=err)
        return EXIT_USAGE
    src = _open(args.src, err, create=False)
    if src is None:
        return EXIT_USAGE
    dst = _open(args.dst, err, create=True)
    if dst is None:
        src.close()
        return EXIT_USAGE
    try:
        return _copy_all(args, src, dst, out, err)
    finally:
        src.close()
        dst.close()


def _copy_all(
    args: argparse.Namespace, src: SessionStore, dst: SessionStore, out: TextIO, err: TextIO
) -> int:
    src_url, dst_url = redact_url(src.engine.url), redact_url(dst.engine.url)
    known = src.engine.list_sessions()
    sessions: list[str] = known if args.all else list(args.sessions)
    quiet: bool = args.quiet

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=err, flush=True)

    say(f"migrate: {len(sessions)} session(s) from {src_url} to {dst_url}")
    results: list[dict[str, Any]] = []
    failed = 0
    for n, sid in enumerate(sessions, 1):
        tag = f"[{n}/{len(sessions)}] {sid!r}"
        last_said = [0]

        def progress(
            done: int, total: int, tag: str = tag, last_said: list[int] = last_said
        ) -> None:
            if done - last_said[0] >= 10_000:
                last_said[0] = done
                say(f"migrate: {tag}: {done}/{total} lines")

        row: dict[str, Any] = {"session_id": sid}
        try:
            if sid not in known:
                raise EventStoreError(f"{src_url} has no session {sid!r}")
            res = migrate_session(src.engine, dst, sid, progress)
            problems = _check(src, dst, sid)
        except EventStoreError as exc:
            failed += 1
            row.update(ok=False, error=one_line(str(exc)))
            say(f"migrate: {tag}: FAILED: {row['error']}")
            results.append(row)
            continue
        row.update(_result_fields(res), ok=not problems, problems=problems)
        if problems:
            failed += 1
            say(f"migrate: {tag}: copied, but: {'; '.join(problems)}")
        else:
            say(
                f"migrate: {tag}: {res.written} written, {res.already} already there,"
                " verify clean on both sides"
            )
        results.append(row)
    if args.json:
        out.write(msgspec.json.encode(results).decode() + "\n")
    else:
        copied = sum(1 for r in results if r.get("ok"))
        print(
            f"migrated {copied} of {len(sessions)} session(s) to {dst_url}"
            + (f"; {failed} failed" if failed else ""),
            file=out,
        )
    return EXIT_FAILED if failed else EXIT_OK


def _result_fields(res: MigrationResult) -> dict[str, Any]:
    return {
        "written": res.written,
        "already": res.already,
        "total": res.total,
    }


def _check(src: SessionStore, dst: SessionStore, sid: str) -> list[str]:
    """Both sides hold the same bytes, and each verifies clean."""
    problems: list[str] = []
    if not same_history(src.engine, dst.engine, sid):
        problems.append("the copy's lines differ from the source's")
    for name, store in (("source", src), ("destination", dst)):
        report = store.verify(sid)
        if not report.ok:
            bad = next(p for p in report.problems if p.severity == "error")
            problems.append(
                f"{name} fails verify: {bad.kind} at byte {bad.offset} (seq {bad.seq}):"
                f" {one_line(bad.message)}"
            )
    return problems
