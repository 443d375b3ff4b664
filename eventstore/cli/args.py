"""What the `eventstore` subcommands share on the command line: exit statuses, the one-line
error (`CliError`), argument types, and the options every command spells the same way
(ROOT, SESSION, --json, --full, --at-seq/--at-time, --event-types).

A command module (`eventstore/cli_<name>.py`) builds its subparser with `add_command`
and these helpers, so every command reads and validates its arguments alike.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeAlias

from eventstore.errors import InvalidArgumentError
from eventstore.ops.history import parse_time as parse_iso_time
from eventstore.ops.lifecycle import parse_age

__all__ = [
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_USAGE",
    "CliError",
    "Subparsers",
    "add_as_of",
    "add_command",
    "add_full",
    "add_root",
    "add_session",
    "age",
    "nonneg_int",
    "parse_time",
    "poll_seconds",
]

EXIT_OK = 0
EXIT_PROBLEMS = 1  # verify found problems; some sessions failed (compact, import-legacy)
EXIT_USAGE = 2  # bad usage, missing root, unknown session, corrupt log, unsafe path

# the `sub` that every command module's add_parser(sub) gets
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class CliError(Exception):
    """A one-line error for stderr; the command exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# -- argument types --------------------------------------------------------------------


def parse_time(text: str) -> datetime:
    """ISO 8601 (`2026-11-29T15:40`, `...Z`, `...+01:00`); no offset means UTC (the
    library's own parser, so `--at-time` and `state_at(at=str)` agree)."""
    try:
        return parse_iso_time(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def age(text: str) -> timedelta:
    """An age: a number and a unit (`30d`, `12h`, `90m`, `45s`, `2w`)."""
    try:
        return parse_age(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {n}")
    return n


def poll_seconds(text: str) -> float:
    """A poll interval in seconds (eventstore.ops.follow.poll_interval_of: a shorter one
    would spin a core)."""
    from eventstore.ops.follow import poll_interval_of

    try:
        return poll_interval_of(float(text))
    except ValueError:  # not a number, or InvalidArgumentError
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds >= 0.001 (a poll interval): {text!r}"
        ) from None


# -- the shared options ----------------------------------------------------------------


def add_command(
    sub: Subparsers,
    name: str,
    func: Callable[[argparse.Namespace], int],
    help_: str,
    examples: str,
) -> argparse.ArgumentParser:
    """A subcommand running `func(args) -> exit status`, with `--json` and its examples."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=textwrap.fill(help_, 79),  # the raw formatter keeps it as given
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=func)
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    return p


def add_root(p: argparse.ArgumentParser) -> None:
    """ROOT (a store directory, or a store URL) and --event-types."""
    p.add_argument(
        "root", metavar="ROOT", help="the store: a directory, or a URL (file://, memory://, ...)"
    )
    p.add_argument(
        "--event-types",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="load custom event types (an Event subclass or a list of them; repeatable)",
    )
    add_keys(p)


def add_keys(p: argparse.ArgumentParser) -> None:
    """--master-key FILE (repeatable): master keys, for encrypted sessions (docs/encryption.md)."""
    p.add_argument(
        "--master-key",
        dest="key_files",
        action="append",
        default=[],
        metavar="FILE",
        help="a master key file, to read and write encrypted sessions (repeatable; the"
        " first wraps new data keys)",
    )


def add_session(p: argparse.ArgumentParser) -> None:
    """ROOT and SESSION."""
    add_root(p)
    p.add_argument("session", metavar="SESSION", help="the session id")


def add_full(p: argparse.ArgumentParser) -> None:
    """--full: long text is shown whole instead of cut to the terminal's width."""
    p.add_argument("--full", action="store_true", help="show long text in full")


def add_as_of(p: argparse.ArgumentParser) -> None:
    """--at-seq N | --at-time T."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--at-seq", type=nonneg_int, metavar="N", help="as of sequence number N")
    g.add_argument("--at-time", type=parse_time, metavar="T", help="as of time T (ISO 8601)")
