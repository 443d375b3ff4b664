"""What one durable append can cost on this disk, whatever the store: the floor under the
`fsync` rows of `python -m bench`.

    python -m bench.fsync_floor [--n 300] [--repeat 5] [--dir DIR]

Times, per operation, medians of `--repeat` runs of `--n` operations each, in one run:

- `grow`: `write(2)` of a 1,900-byte line at the end of a growing file, then
  `fdatasync`: what an append-only log must do (the size changes, so the file system
  journals its metadata with every flush);
- `overwrite`: the same write into a file already that long, then `fdatasync`: what a
  store that reuses a preallocated file does (SQLite's WAL after a checkpoint);
- `eventstore`: `append_transcript_messages` of `SessionStore(durability="fsync")`;
- `sqlite FULL`: one INSERT of the same bytes per transaction, WAL, `synchronous=FULL`.

One flush per durable operation is the floor for every row; the ratios show how far
each store is from it on this disk (see the README's Performance section).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LINE = b"x" * 1899 + b"\n"


def _grow(d: Path, n: int) -> Callable[[], None]:
    path = d / "grow.log"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)

    def op() -> None:
        os.write(fd, LINE)
        os.fdatasync(fd)

    return op


def _overwrite(d: Path, n: int) -> Callable[[], None]:
    path = d / "overwrite.log"
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    os.write(fd, b"\0" * (len(LINE) * (n + 1)))
    os.fsync(fd)
    os.lseek(fd, 0, os.SEEK_SET)

    def op() -> None:
        os.write(fd, LINE)
        os.fdatasync(fd)

    return op


def _eventstore(d: Path, n: int) -> Callable[[], None]:
    from eventstore import SessionStore
    from eventstore.records import (
        Message,
        Role,
    )

    store = SessionStore(d / "store", durability="fsync")
    messages = [Message(role=Role.USER, content="x" * 1700)]
    store.append_transcript_messages("s", messages)

    def op() -> None:
        store.append_transcript_messages("s", messages)

    return op


def _sqlite(d: Path, n: int) -> Callable[[], None]:
    db = sqlite3.connect(d / "full.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (v BLOB)")
    text = LINE.decode()

    def op() -> None:
        db.execute("BEGIN")
        db.execute("INSERT INTO t VALUES (?)", (text,))
        db.execute("COMMIT")

    return op


ROWS: dict[str, Callable[[Path, int], Callable[[], None]]] = {
    "grow": _grow,
    "overwrite": _overwrite,
    "eventstore": _eventstore,
    "sqlite FULL": _sqlite,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fsync_floor", description=__doc__)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args(argv)
    times: dict[str, list[float]] = {name: [] for name in ROWS}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.repeat):
            for name, make in ROWS.items():  # interleaved: drift hits every row alike
                d = Path(tmp) / f"{r}-{name.replace(' ', '_')}"
                d.mkdir()
                op = make(d, args.n)
                t0 = time.perf_counter()
                for _ in range(args.n):
                    op()
                times[name].append((time.perf_counter() - t0) / args.n * 1e6)
    floor = statistics.median(times["grow"])
    print(f"one durable operation, medians of {args.repeat} x {args.n}:\n")
    print("| row | µs per operation | / grow |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:,.0f} | {med / floor:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
