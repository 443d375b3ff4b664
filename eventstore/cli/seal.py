"""`eventstore seal`: sign the heads of sessions with an Ed25519 key (a seal line in each
log, and in a witness file when one is given). A view of `SessionStore.seal`
(`eventstore.ops.seal`); `eventstore verify --public-key` checks the seals.
"""

from __future__ import annotations

import argparse

from eventstore.cli.args import EXIT_OK, CliError, Subparsers, add_command, add_root
from eventstore.cli.format import emit_json, plural, table
from eventstore.cli.store import need_sessions, open_store, shown_root
from eventstore.ops.seal import SealPolicy
from eventstore.signing import key_id, load_signing_key

__all__ = ["add_parser"]


def add_parser(sub: Subparsers) -> None:
    """Register `seal`."""
    p = add_command(
        sub,
        "seal",
        run_seal,
        "sign sessions' heads with an Ed25519 key (verify --public-key checks them)",
        "  eventstore seal .eventstore demo --key seal.pem\n"
        "  eventstore seal .eventstore --all --key seal.pem --witness seals.jsonl",
    )
    add_root(p)
    p.add_argument("sessions", metavar="SESSION", nargs="*", help="the session ids")
    p.add_argument("--all", action="store_true", help="seal every session")
    p.add_argument(
        "--key", metavar="FILE", required=True, help="the Ed25519 private key (PEM, unencrypted)"
    )
    p.add_argument(
        "--witness",
        metavar="FILE|URL",
        help="also write each seal to this file, or to the store at this URL",
    )
    p.add_argument(
        "--every",
        metavar="N",
        type=int,
        help="promise a seal at least every N events from here on (verify checks it)",
    )


def run_seal(args: argparse.Namespace) -> int:
    """Seal the sessions named (or every one); print what was sealed."""
    if args.all and args.sessions:
        raise CliError("give SESSIONs or --all, not both")
    if not args.all and not args.sessions:
        raise CliError("give a SESSION or --all")
    key = load_signing_key(args.key)
    policy = SealPolicy(every=args.every, on_close=False, witness=args.witness)
    rows: list[dict[str, object]] = []
    with open_store(args, signing_key=key, seal_policy=policy) as store:
        ids = store.list_sessions() if args.all else list(args.sessions)
        if not args.all:
            need_sessions(store, ids, shown_root(args))
        for sid in ids:
            facts = store.seal(sid)
            rows.append(
                {
                    "session_id": sid,
                    "sealed": facts is not None,
                    "seq": None if facts is None else facts.seq,
                    "h": None if facts is None else facts.h,
                    "key_id": key_id(key),
                }
            )
    if args.json:
        emit_json(rows)
        return EXIT_OK
    body = [
        [r["session_id"], "-" if r["seq"] is None else r["seq"], r["h"] or "already sealed"]
        for r in rows
    ]
    print(table(["SESSION", "SEQ", "HEAD"], body, right=(1,)))
    sealed = sum(1 for r in rows if r["sealed"])
    print(f"\n{plural(sealed, 'session')} sealed with key {key_id(key)}")
    return EXIT_OK
