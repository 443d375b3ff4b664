"""The integrity commands: `verify` (hash links, sequence, decoding, batches, the archive
chain; exit 1 on a problem) and `repair` (explicit: truncate a torn tail, or keep the
valid prefix and move a corrupt log aside). Views of `eventstore.ops.audit.verify`/`repair`.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from eventstore.cli.args import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Subparsers,
    add_command,
    add_full,
    add_root,
    add_session,
)
from eventstore.cli.format import (
    emit_json,
    fmt_bytes,
    kv,
    plural,
    table,
    terminal_width,
)
from eventstore.cli.store import (
    known_session,
    open_store,
    shown_root,
    store_path,
)
from eventstore.errors import EventStoreError, UnknownSessionError
from eventstore.ops import audit
from eventstore.signing import load_public_key

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from eventstore.store import SessionStore

__all__ = ["add_parser"]


def add_parser(sub: Subparsers) -> None:
    """Register `verify` and `repair`."""
    p = add_command(
        sub,
        "verify",
        run_verify,
        "check hash links, sequence, decoding and batches (exit 1 on a problem)",
        "  eventstore verify .eventstore demo\n  eventstore verify .eventstore --all --json",
    )
    add_root(p)
    p.add_argument("session", metavar="SESSION", nargs="?", help="the session id")
    p.add_argument("--all", action="store_true", help="verify every session")
    p.add_argument(
        "--public-key",
        metavar="FILE",
        help="check every seal's signature and sealed head with this Ed25519 key (PEM)",
    )
    p.add_argument(
        "--witness",
        metavar="FILE|URL",
        help="check the seals this witness (a file or a store URL) holds",
    )
    add_full(p)

    p = add_command(
        sub,
        "repair",
        run_repair,
        "truncate a torn tail, or keep the valid prefix and move a corrupt log aside",
        "  eventstore repair .eventstore demo",
    )
    add_session(p)


def _shown_file(path: str, args: argparse.Namespace) -> str:
    """A file of the store relative to ROOT when it is under it."""
    root = store_path(str(args.root))
    if root is None:
        return path
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def run_verify(args: argparse.Namespace) -> int:
    """Verify one session or all; exit 1 if any has an error."""
    if args.all and args.session:
        raise CliError("give a SESSION or --all, not both")
    if not args.all and not args.session:
        raise CliError("give a SESSION or --all")
    key = None if args.public_key is None else load_public_key(args.public_key)
    reports: list[audit.VerifyReport] = []
    gone: list[str] = []  # (--all) listed, then purged before their turn
    with open_store(args) as store:
        if args.all:
            for sid in store.list_sessions():
                try:
                    reports.append(_verify_one(store, sid, key, args.witness))
                except UnknownSessionError:  # not a failure: a later listing would not name it
                    gone.append(sid)
        else:
            # not whether a page lists it: the store says whether anything of it is
            # stored (a session whose head or index row is gone is damaged, not unknown)
            with known_session(store, args.session, shown_root(args), check_first=False):
                reports = [_verify_one(store, args.session, key, args.witness)]
    ok = all(r.ok for r in reports)
    status = EXIT_OK if ok else EXIT_PROBLEMS
    if args.json:
        emit_json(reports[0] if not args.all else {"ok": ok, "sessions": reports, "gone": gone})
        return status
    for r in reports:
        errors = sum(1 for p in r.problems if p.severity == "error")
        warnings = len(r.problems) - errors
        print(
            f"{'ok' if r.ok else 'FAILED':<6}  {r.session_id}  events={r.events}"
            f"  head={r.head_hash or '-'}  files={len(r.files)}  errors={errors}"
            f"  warnings={warnings}"
        )
        if r.problems:
            rows = [
                [
                    p.severity,
                    _shown_file(p.file, args),
                    p.offset,
                    "-" if p.seq is None else p.seq,
                    p.kind,
                    p.message,
                ]
                for p in r.problems
            ]
            headers = ["SEVERITY", "FILE", "OFFSET", "SEQ", "KIND", "MESSAGE"]
            # indented under the session's line, every row alike (a cell's own leading
            # spaces would be folded away without --full)
            fitted = table(
                headers, rows, right=(2, 3), flex=5, full=args.full, width=terminal_width() - 2
            )
            print(textwrap.indent(fitted, "  "))
    for sid in gone:
        print(f"{'gone':<6}  {sid}  (purged since the listing: nothing of it is stored)")
    if len(reports) > 1 or args.all:
        bad = sum(1 for r in reports if not r.ok)
        since = f", {len(gone)} gone since the listing" if gone else ""
        print(f"\n{plural(len(reports), 'session')} verified, {bad} with errors{since}")
    return status


def _verify_one(
    store: SessionStore, session_id: str, key: Ed25519PublicKey | None, witness: str | None
) -> audit.VerifyReport:
    """The session's report; one that cannot be read is reported unreadable, never
    stops the others. UnknownSessionError (nothing of it is stored) propagates."""
    try:
        return store.verify(session_id, public_key=key, witness=witness)
    except UnknownSessionError:
        raise
    except (EventStoreError, OSError) as exc:
        problem = audit.Problem("", 0, None, "unreadable", str(exc))
        return audit.VerifyReport(session_id, False, [problem], "", 0, 0, [])


def run_repair(args: argparse.Namespace) -> int:
    """Truncate a torn tail, or keep the valid prefix and move the corrupt log aside."""
    with (
        open_store(args) as store,
        known_session(store, args.session, shown_root(args), check_first=False),
    ):
        r = audit.repair(store.core, args.session)
    if args.json:
        emit_json(r)
        return EXIT_OK
    print(
        kv(
            [
                ("session", r.session_id),
                ("action", r.action),
                ("log", _shown_file(r.log, args)),
                ("kept", f"{plural(r.kept_events, 'event')}, {fmt_bytes(r.kept_bytes)}"),
                ("dropped", fmt_bytes(r.dropped_bytes)),
                ("moved aside to", _shown_file(r.moved_to, args) if r.moved_to else "-"),
                ("why", r.message),
            ]
        )
    )
    return EXIT_OK
