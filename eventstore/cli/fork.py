"""The `fork` command: start a new session from another's state at a sequence number.
A view of `SessionStore.fork_session`: it prints where the new session came from (the
source, the seq and the hash of the source's line there, which `verify` checks).

Exit status: 0 forked; 2 a usage error (a missing store, an unknown source, a seq it
does not hold, a destination that exists: nothing is written then).
"""

from __future__ import annotations

import argparse

from eventstore.cli.args import (
    EXIT_OK,
    Subparsers,
    add_command,
    add_root,
    nonneg_int,
)
from eventstore.cli.format import emit_json, kv
from eventstore.cli.store import open_store

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    """Register `fork`."""
    p = add_command(
        sub,
        "fork",
        run,
        "start a new session from another's state (at its head, or after seq N)",
        "  eventstore fork .eventstore demo demo-retry\n"
        "  eventstore fork .eventstore demo demo-at-5 --at-seq 5 --json",
    )
    add_root(p)
    p.add_argument("source", metavar="SRC", help="the session to fork")
    p.add_argument("dest", metavar="DST", help="the new session (must not exist)")
    p.add_argument(
        "--at-seq", type=nonneg_int, metavar="N", help="fork the state after seq N (default: head)"
    )


def run(args: argparse.Namespace) -> int:
    """Execute `eventstore fork`; returns the exit status."""
    with open_store(args) as store:
        done = store.fork_session(args.source, args.dest, at_seq=args.at_seq)
    if args.json:
        emit_json(
            {
                "session_id": done.session_id,
                "source": done.source,
                "seq": done.seq,
                "hash": done.h,
                "bytes": done.bytes,
            }
        )
    else:
        print(f"forked {done.session_id!r} from {done.source!r} at seq {done.seq}")
        print(kv([("hash", done.h), ("next seq", done.seq + 1)]))
    return EXIT_OK
