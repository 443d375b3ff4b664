"""The paged view of `eventstore sessions`: a page of the store's session index
(`SessionStore.sessions`) in an order, filtered by id prefix, labels and last write,
and `--rebuild` (`SessionStore.rebuild_index`). `eventstore sessions ROOT` with none of
these options keeps its full listing (eventstore.cli.inspect)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from eventstore import entropy
from eventstore.cli.args import CliError, parse_time
from eventstore.cli.format import emit_json, fmt_bytes, fmt_time, table
from eventstore.cli.store import open_store, shown_root
from eventstore.errors import InvalidArgumentError
from eventstore.ops.lifecycle import parse_age

__all__ = ["add_options", "paged", "run_page"]

_PAGING = ("prefix", "label", "updated_since", "limit", "after", "order", "rebuild")


def add_options(p: argparse.ArgumentParser) -> None:
    """The paging and filtering options of `sessions`."""
    g = p.add_argument_group("pages of the session index (any of these lists a page)")
    g.add_argument("--prefix", help="only sessions whose id starts with PREFIX")
    g.add_argument(
        "--label",
        action="append",
        metavar="K=V",
        help="only sessions carrying label K with value V (repeat: all of them)",
    )
    g.add_argument(
        "--updated-since",
        metavar="TIME|AGE",
        help="only sessions written at or after TIME (ISO 8601) or within AGE (30d, 12h)",
    )
    g.add_argument("--limit", type=_positive, help="at most N sessions (the page's size)")
    g.add_argument(
        "--after",
        metavar="CURSOR",
        help="the page after this cursor (printed below a full page, and in each --json entry)",
    )
    g.add_argument(
        "--order",
        choices=("updated", "created", "id"),
        help="newest written first (updated, the default), newest created first, or by id",
    )
    g.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the session index from the logs first (reads every session)",
    )


def paged(args: argparse.Namespace) -> bool:
    """Whether `sessions` was asked for a page (any paging option given)."""
    return any(getattr(args, name, None) not in (None, False) for name in _PAGING)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {n}")
    return n


def _labels(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--label takes K=V, not {pair!r}")
        out[key] = value
    return out


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return entropy.now() - parse_age(text)
    except InvalidArgumentError:
        try:
            return parse_time(text)
        except argparse.ArgumentTypeError:
            raise CliError(
                f"--updated-since takes an ISO 8601 time or an age (30d, 12h), not {text!r}"
            ) from None


def run_page(args: argparse.Namespace) -> int:
    """Print one page of the session index (or its JSON); below a full page, the
    command for the next one."""
    labels = _labels(args.label)
    since = _since(args.updated_since)
    with open_store(args) as store:
        if args.rebuild:
            n = store.rebuild_index()
            print(f"eventstore: rebuilt the session index: {n} sessions", file=sys.stderr)
        page = store.sessions(
            args.prefix,
            after=args.after,
            limit=args.limit,
            order=args.order or "updated",
            labels=labels,
            updated_since=since,
        )
    if args.json:
        emit_json([info.to_dict() for info in page])
        return 0
    if not page:
        print(f"no sessions in {shown_root(args)} match")
        return 0
    rows = [
        [
            i.session_id,
            fmt_time(i.updated),
            fmt_time(i.created),
            i.last_seq,
            i.events,
            fmt_bytes(i.bytes),
            ",".join(f"{k}={v}" for k, v in sorted(i.labels.items())),
        ]
        for i in page
    ]
    print(
        table(
            ["SESSION", "UPDATED", "CREATED", "LAST SEQ", "IN LOG", "LOG", "LABELS"],
            rows,
            right=(3, 4, 5),
        )
    )
    if args.limit is not None and len(page) == args.limit:
        print(f"next page: --after {page[-1].cursor}", file=sys.stderr)
    return 0
