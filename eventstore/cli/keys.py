"""The `eventstore keygen` and `eventstore rekey` subcommands: master keys of encrypted
stores (docs/encryption.md).

    eventstore keygen FILE --id KEY_ID                       write a new master key file
    eventstore rekey ROOT --old-key FILE --new-key FILE      rewrap every data key

Owns the command-line view of `KeyRing.write_new` and `SessionStore.rekey`. Other
commands read encrypted sessions with `--master-key FILE` (eventstore.cli.args.add_root).
Exit status: 0 done, 1 some data keys were left (forgotten, or wrapped by a master key
the old ring lacks), 2 a usage error (nothing written).
"""

from __future__ import annotations

import argparse
import sys

from eventstore.cli.args import CliError, Subparsers, add_command, add_root
from eventstore.cli.format import emit_json
from eventstore.cli.store import open_store
from eventstore.errors import EventStoreError
from eventstore.format.crypt import KeyRing

__all__ = ["add_parser", "run_keygen", "run_rekey"]


def add_parser(sub: Subparsers) -> None:
    """Register `keygen` and `rekey`."""
    p = add_command(
        sub,
        "keygen",
        run_keygen,
        "write a new random master key (AES-256) to FILE (created 0600, never overwritten)",
        "  eventstore keygen m1.key --id m1\n  eventstore keygen m2.key --id m2\n",
    )
    p.add_argument("file", metavar="FILE", help="the key file to create")
    p.add_argument("--id", dest="key_id", required=True, help="the key id stored with the key")
    p = add_command(
        sub,
        "rekey",
        run_rekey,
        "rewrap every session's data key with a new master key; no log is rewritten",
        "  eventstore rekey .eventstore --old-key m1.key --new-key m2.key\n",
    )
    add_root(p)
    p.add_argument("--old-key", action="append", required=True, metavar="FILE",
                   help="a master key that wraps data keys now (repeatable)")  # fmt: skip
    p.add_argument("--new-key", required=True, metavar="FILE", help="the master key to wrap with")


def run_keygen(args: argparse.Namespace) -> int:
    """Write the key file."""
    try:
        KeyRing.write_new(args.file, args.key_id)
    except EventStoreError as exc:  # (an existing file too: never overwritten)
        raise CliError(str(exc)) from None
    if args.json:
        emit_json({"file": args.file, "key_id": args.key_id})
    else:
        print(f"wrote master key {args.key_id!r} to {args.file}")
    return 0


def run_rekey(args: argparse.Namespace) -> int:
    """Rewrap, and say how many keys were rewrapped and left."""
    args.key_files = list(args.old_key)
    try:
        new = KeyRing.load(args.new_key)
    except EventStoreError as exc:
        raise CliError(str(exc)) from None
    with open_store(args) as store:
        done, left = store.rekey(new)
    if args.json:
        emit_json({"rewrapped": done, "left": left, "key_id": new.current})
    else:
        print(f"rewrapped {done} data key(s) with master key {new.current!r}; left {left}")
        if left:
            print(
                "left: forgotten keys, or keys wrapped by a master key not given", file=sys.stderr
            )
    return 1 if left else 0
