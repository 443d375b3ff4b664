"""The `follow` command: print a session's events as any process appends them, like
`tail -f`, until SIGINT or SIGTERM. A view of `eventstore.ops.audit.follow`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from eventstore.cli.args import (
    EXIT_OK,
    CliError,
    Subparsers,
    add_command,
    add_full,
    add_session,
    nonneg_int,
    poll_seconds,
)
from eventstore.cli.format import (
    emit_json_line,
    event_line,
    shorten,
    terminal_width,
)
from eventstore.cli.store import (
    check_session_id,
    is_stored,
    open_store,
    shown_root,
    unknown_session,
)
from eventstore.ops import audit
from eventstore.ops.export import event_to_json
from eventstore.ops.history import first_kept_seq

__all__ = ["add_parser", "run"]


def add_parser(sub: Subparsers) -> None:
    """Register `follow`."""
    p = add_command(
        sub,
        "follow",
        run,
        "print events as they are appended (like tail -f; Ctrl-C stops)",
        "  eventstore follow .eventstore demo\n"
        "  eventstore follow .eventstore demo --from-seq 1 --json\n"
        "  eventstore follow .eventstore next-run --wait     # a session not started yet",
    )
    add_session(p)
    p.add_argument(
        "--from-seq", type=nonneg_int, metavar="N", help="start at N (default: the last 10 events)"
    )
    p.add_argument(
        "--interval",
        type=poll_seconds,
        default=0.2,
        metavar="S",
        help="poll every S seconds, S >= 0.001 (default 0.2)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="if the session does not exist yet, wait for it (then print from its start)",
    )
    add_full(p)


def run(args: argparse.Namespace) -> int:
    """Print events as they are appended until SIGINT/SIGTERM."""
    with open_store(args) as store:
        check_session_id(args.session)
        # what the store holds of it, not whether a listing names it (as every command)
        known = is_stored(store, args.session)
        if not known and not args.wait:
            unknown = unknown_session(args.session, shown_root(args))
            raise CliError(f"{unknown} (or give --wait to wait for it)")
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            from_seq = args.from_seq
            if from_seq is None:  # like tail -f: the last 10 still held, then what comes
                first = first_kept_seq(store.core, args.session) if known else 1
                from_seq = max(first, store.last_seq(args.session) - 9) if known else 1
            width = terminal_width()
            for ev in audit.follow(
                store.core, args.session, from_seq=from_seq, poll_interval=args.interval, stop=stop
            ):
                if args.json:
                    emit_json_line(event_to_json(ev))
                    continue
                seq, ts, tag, summary = event_line(ev)
                head = f"{seq:>6}  {ts}  {tag:<21}  "
                room = max(12, width - 1 - len(head))
                sys.stdout.write(head + shorten(summary, room, args.full) + "\n")
                sys.stdout.flush()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return EXIT_OK
