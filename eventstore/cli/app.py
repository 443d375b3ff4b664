"""The `eventstore` command: the parser, the list of command modules, and `main`.

Each subcommand lives in its own module `eventstore/cli_<name>.py` with
`add_parser(sub)` (registers its subcommand(s), each with `func=`) and a `run(args) ->
int`; adding a command is adding its module's name to `COMMAND_MODULES`. Commands only
format what a library call returns: there is one core, and the command is a view of it.
Output is an aligned table fitted to the terminal by default and JSON with `--json`.

Exit statuses: 0 ok; 1 problems found (verify, sessions) or some sessions failed
(compact, import-legacy); 2 usage errors, a missing store root, an unknown session, a
corrupt log, history not available. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from eventstore import __version__
from eventstore.cli.args import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
)
from eventstore.cli.format import one_line
from eventstore.engines.base import redact_text
from eventstore.errors import EventStoreError

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

PROG = "eventstore"

# The command modules, in the order `eventstore --help` lists their commands. One line
# per module: `add_parser(sub)` registers its subcommands, each with `func=` its runner.
COMMAND_MODULES: tuple[str, ...] = (
    "eventstore.cli.demo",
    "eventstore.cli.inspect",
    "eventstore.cli.verify",
    "eventstore.cli.seal",
    "eventstore.cli.follow",
    "eventstore.cli.compact",
    "eventstore.cli.fork",
    "eventstore.cli.legacy",
    "eventstore.cli.contexts",
    "eventstore.cli.claude_code",
    "eventstore.cli.delete",
    "eventstore.cli.gc",
    "eventstore.cli.keys",
    "eventstore.cli.postgres",
    "eventstore.cli.report",
)

EPILOG = """\
examples:
  eventstore demo                      write a demo session under ./.eventstore
  eventstore sessions .eventstore      list the sessions of a store
  eventstore state .eventstore demo --at-seq 10
  eventstore log .eventstore demo --type feature_pass_updated --json
  eventstore verify .eventstore --all  check every session (exit 1: a problem)
  eventstore compact .eventstore --all --min-bytes 1000000
  eventstore follow .eventstore demo --json   like tail -f, JSON lines

exit codes:
  0  ok
  1  problems found (verify, sessions), or some sessions failed (compact,
     import-legacy)
  2  usage error, missing store root, unknown session, corrupt log

ROOT is a store directory (or a store URL). Times are shown in UTC; --at-time,
--since and --until take ISO 8601 (no offset: UTC). Every command takes --json;
`log` and `follow` then print one JSON object per line. Custom event types:
--event-types MODULE:ATTR, or an entry point in the group
`eventstore.event_types`.
"""


def command_modules() -> list[ModuleType]:
    """The importable modules of `COMMAND_MODULES` (one not installed is left out)."""
    found: list[ModuleType] = []
    for name in COMMAND_MODULES:
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but needs something missing: a bug
                raise
    return found


def build_parser() -> argparse.ArgumentParser:
    """The `eventstore` argument parser (every subcommand, with examples)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Audit, replay, compact and import eventstore session logs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in command_modules():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: `sys.argv[1:]`); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return EXIT_OK
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except EventStoreError as exc:  # an unknown session, a corrupt log, an unsafe path
        return _fail(one_line(exc), EXIT_USAGE)
    except (ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            # the reader (head, less) went away: not an error; silence the flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
        return _fail(one_line(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130


def _fail(message: str, code: int) -> int:
    # an error may quote a store URL: never print its password
    print(f"{PROG}: error: {redact_text(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
