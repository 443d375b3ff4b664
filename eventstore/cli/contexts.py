"""The `eventstore contexts ROOT [--history] [--json]` subcommand.

Owns the command-line view of the harness session map (eventstore.harness_sessions):
the current bindings (`<root>/*/harness-session.json`) or, with `--history`, every put
and forget recorded in the map's log. ROOT is taken as every command takes it
(eventstore.cli.store): the map's directory or a `file://` URL of it, or the URL of a
store on another engine (`memory://`, `postgresql://`, `redis://`) holding the map's
history, as `eventstore migrate ROOT/.eventstore URL --all` copies it there; such a
store holds no bindings (they are files), so it is read with `--history` only.
`add_parser` registers it on the `eventstore` command's subparsers; `run` executes it
and returns the exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import msgspec

from eventstore.cli.args import CliError
from eventstore.cli.format import one_line
from eventstore.cli.store import store_at, store_path
from eventstore.engines.base import redact_text
from eventstore.errors import EventStoreError
from eventstore.harness_sessions import (
    HISTORY_EVENT_TYPES,
    HarnessBinding,
    HistoryEntry,
    current_bindings,
    history_in,
    read_history,
)

__all__ = ["add_parser", "run"]

_EXAMPLES = """\
examples:
  eventstore contexts ~/.murmur/contexts             # each context's session
  eventstore contexts ~/.murmur/contexts --history   # every put and forget
  eventstore contexts ~/.murmur/contexts --json | jq '.[].session_id'
  eventstore contexts postgresql://USER@HOST/DB --history  # migrated there
"""

# exit statuses: 0 ok, 1 the history cannot be read (e.g. tampered), 2 bad usage/root
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `contexts` on the `eventstore` command's subparsers (sets `func=run`)."""
    p = subparsers.add_parser(
        "contexts",
        help="list harness sessions per conversation context (the harness session map)",
        description=(
            "Show which harness session each conversation context resumes, read from\n"
            "ROOT/<context-id>/harness-session.json, or with --history every put and\n"
            "forget recorded in the map's audit log (ROOT/.eventstore, or the store\n"
            "ROOT names when it is the URL of another engine's store)."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # kept as given (a Path would fold a URL's `//`, hiding it from redact_text)
    p.add_argument(
        "root",
        metavar="ROOT",
        help="the map's root directory (or file:// URL), or a store URL holding its history",
    )
    p.add_argument(
        "--history", action="store_true", help="show every put and forget instead of bindings"
    )
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute `eventstore contexts` for parsed `args`; returns the exit status."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    shown = redact_text(str(args.root))
    history: list[HistoryEntry] = []
    bindings: list[HarnessBinding] = []
    try:
        root = store_path(str(args.root))  # None: the URL of another engine's store
        if root is None:
            history = _history_at(str(args.root), shown, args.history)
        elif args.history:
            history = read_history(root)
        else:
            bindings = current_bindings(root)
    except CliError as exc:
        print(f"eventstore contexts: error: {redact_text(str(exc))}", file=err)
        return exc.code
    except FileNotFoundError:
        print(f"eventstore contexts: error: {shown}: no such directory", file=err)
        return EXIT_USAGE
    except NotADirectoryError:
        print(f"eventstore contexts: error: {shown}: not a directory", file=err)
        return EXIT_USAGE
    except (OSError, EventStoreError) as exc:
        print(f"eventstore contexts: error: {one_line(str(exc))}", file=err)
        return EXIT_FAILED
    if args.json:
        rows = history if args.history else bindings
        out.write(msgspec.json.encode(rows).decode("utf-8") + "\n")
    elif args.history:
        _print_history(history, out)
    else:
        _print_bindings(bindings, out, root)
    return EXIT_OK


def _history_at(url: str, shown: str, history: bool) -> list[HistoryEntry]:
    """The map's history held by the store at `url` (never created: CliError when it
    is not there or cannot be opened, as for every command)."""
    if not history:
        raise CliError(
            f"{shown} is a store: it can hold the map's history (give --history), not its"
            " bindings, which are files in the map's directory"
        )
    try:
        store = store_at(url, create=False, event_types=HISTORY_EVENT_TYPES)
    except EventStoreError as exc:
        raise CliError(one_line(str(exc))) from None
    with store:
        return history_in(store)


def _print_bindings(rows: Sequence[HarnessBinding], out: TextIO, root: Path | None) -> None:
    if not rows:
        print(f"no harness sessions under {root}", file=out)
        return
    header = ("CONTEXT", "SESSION", "HARNESS", "DRIVER", "CREATED", "UPDATED")
    body = [
        (
            b.context_id,
            b.session_id,
            b.harness,
            b.driver,
            _ms(b.created_ms),
            _ms(b.updated_ms),
        )
        for b in rows
    ]
    _table(header, body, out)


def _print_history(rows: Sequence[HistoryEntry], out: TextIO) -> None:
    if not rows:
        print("no history recorded", file=out)
        return
    header = ("SEQ", "TIME", "ACTION", "CONTEXT", "SESSION", "HARNESS", "DRIVER", "BY")
    body = [
        (
            str(h.seq),
            _time(h.at),
            h.action,
            h.context_id,
            h.session_id or "-",
            h.harness or "-",
            h.driver or "-",
            h.by or "-",
        )
        for h in rows
    ]
    _table(header, body, out)


def _table(header: Sequence[str], body: Sequence[Sequence[str]], out: TextIO) -> None:
    # ids are arbitrary text: escape control characters so one row stays one line
    cells = [list(header)] + [[_cell(c) for c in row] for row in body]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)


def _cell(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _ms(ms: int) -> str:
    if ms <= 0:
        return "-"
    try:
        return _time(datetime.fromtimestamp(ms / 1000, UTC))
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
