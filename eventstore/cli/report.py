"""The `eventstore report ROOT SESSION -o FILE.html` and `eventstore serve ROOT` subcommands.

Owns the command-line face of the session report (eventstore.report): it opens the store
(which must exist: a report never creates one), builds the page and writes it to FILE
(atomically, mode 0600: a reader never sees half a page) or to standard output with `-o -`.
`serve` shows the same pages live from a read-only server on 127.0.0.1
(eventstore.report.server). `add_parser` registers both on the `eventstore` command's
subparsers; `run` and `run_serve` execute them and return the exit status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import BinaryIO, TextIO

from eventstore.cli.args import CliError, add_keys
from eventstore.cli.format import one_line
from eventstore.cli.store import open_store, store_path
from eventstore.engines.file.layout import write_atomically
from eventstore.errors import EventStoreError
from eventstore.format.crypt import KeyRing
from eventstore.report.page import (
    MAX_BYTES,
    build_report,
)

__all__ = ["add_parser", "run", "run_serve"]

_EXAMPLES = """\
examples:
  eventstore report .eventstore demo -o demo.html       # open it in a browser
  eventstore report .eventstore demo -o - > demo.html   # on standard output
  eventstore report .eventstore demo -o demo.html --max-bytes 2000000
"""

# exit statuses, as for every `eventstore` command: 0 ok, 2 bad usage, root or session
EXIT_OK = 0
EXIT_USAGE = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `report` on the `eventstore` command's subparsers (sets `func=run`)."""
    p = subparsers.add_parser(
        "report",
        help="write one self-contained HTML page about a session (opens offline)",
        description=(
            "Write one HTML page about SESSION: manifest, verify status and sizes, features\n"
            "passing over time, runs with their progress notes, the transcript and the event\n"
            "log. The page needs no network and no other file."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("root", metavar="ROOT", help="the store: a directory or a store URL")
    p.add_argument("session", metavar="SESSION", help="the session id")
    add_keys(p)
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        required=True,
        help="the HTML file to write ('-': standard output)",
    )
    p.add_argument(
        "--max-bytes",
        type=_positive,
        default=MAX_BYTES,
        metavar="N",
        help=f"cut long text so the page stays under N bytes (default {MAX_BYTES:,})",
    )
    p.set_defaults(func=run)

    p = subparsers.add_parser(
        "serve",
        help="serve the session reports of a store on 127.0.0.1 (read-only)",
        description=(
            "Serve ROOT's sessions on http://127.0.0.1:PORT/: a list of sessions, and each\n"
            "session's report page, built afresh on every request. Read-only; loopback only."
        ),
        epilog="examples:\n  eventstore serve .eventstore\n  eventstore serve .eventstore --port 0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("root", metavar="ROOT", type=Path, help="the store root directory")
    p.add_argument(
        "--port", type=_port, default=8765, metavar="N", help="the port (default 8765; 0: any free)"
    )
    add_keys(p)
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace, err: TextIO | None = None) -> int:
    """Execute `eventstore serve` for parsed `args` until Ctrl-C; returns the exit status."""
    from eventstore.report.server import serve

    err = sys.stderr if err is None else err
    try:
        files = getattr(args, "key_files", None) or []
        serve(args.root, args.port, KeyRing.load(*files) if files else None)
    except KeyboardInterrupt:
        return EXIT_OK
    except OSError as exc:  # no such root, or the port is taken
        print(f"eventstore serve: error: {one_line(str(exc))}", file=err)
        return EXIT_USAGE
    return EXIT_OK


def run(args: argparse.Namespace, out: BinaryIO | None = None, err: TextIO | None = None) -> int:
    """Execute `eventstore report` for parsed `args`; returns the exit status."""
    out = sys.stdout.buffer if out is None else out
    err = sys.stderr if err is None else err
    where = Path(args.output).parent
    if args.output != "-" and not where.is_dir():  # said before any work, in plain words
        what = "is not a directory" if where.exists() else "does not exist"
        print(f"eventstore report: error: cannot write {args.output}: {where} {what}", file=err)
        return EXIT_USAGE
    directory = store_path(str(args.root)) if args.output != "-" else None
    if directory is not None and Path(args.output).resolve().is_relative_to(directory.resolve()):
        # a report over the log it reads (or any file of the store) would replace it
        print(f"eventstore report: error: cannot write {args.output}: inside the store", file=err)
        return EXIT_USAGE
    try:
        with open_store(args) as store:  # a path or any store URL, as every command takes
            page = build_report(store, args.session, max_bytes=args.max_bytes)
    except (CliError, EventStoreError, ValueError, OSError) as exc:
        print(f"eventstore report: error: {one_line(str(exc))}", file=err)
        return EXIT_USAGE
    data = page.encode("utf-8")
    if args.output == "-":
        out.write(data)
        out.flush()
        return EXIT_OK
    try:
        write_atomically(Path(args.output), data)
    except OSError as exc:  # the error's own file name is the temporary one: not shown
        why = exc.strerror or type(exc).__name__
        print(f"eventstore report: error: cannot write {args.output}: {why}", file=err)
        return EXIT_USAGE
    print(f"wrote {args.output} ({len(data):,} bytes)", file=err)
    return EXIT_OK


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value
