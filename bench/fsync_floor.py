"""What one durable append can cost on this disk, whatever the store: the floor under the
`fsync` rows of `python -m bench`, and where an eventstore append's time goes above it.

    python -m bench.fsync_floor [--n 300] [--repeat 5] [--dir DIR] [--paired]

Times, per operation, medians and min-max spreads of `--repeat` runs of `--n` operations
each, the rows interleaved in every run so drift hits them alike (`--paired`: one
operation of each row in turn, for a disk that drifts within a run):

- `grow`: `write(2)` of a 1,900-byte line at the end of a growing file, then
  `fdatasync`: what an append-only log must do (the size changes, so the file system
  journals its metadata with every flush);
- `overwrite`: the same write into a file already that long, then `fdatasync`: what a
  store that reuses a preallocated file does (SQLite's WAL after a checkpoint), the
  floor: one flush of a block written in place;
- `journal calls`: the system calls of one eventstore durable append (below) and nothing
  else (Linux: it reads `/proc/self/fd`): lock, the two identity checks, the log's
  unflushed append, the mirror's write and flush, the lock file's hints, unlock (no
  epoch ends: the eventstore row also flushes its log and a header every 256 KiB);
- `journal calls, lock stat'ed`: the same, the lock file's identity checked by `lstat`
  instead: asking a file's times makes its next write log its inode (Linux 6.13+'s
  fine-grained timestamps), which the flush then pays for;
- `eventstore`: `append_transcript_messages` of `SessionStore(durability="fsync")`;
- `eventstore flush`: the same call with `durability="flush"`: an append without its
  flush (what encoding, chaining, folding and the other system calls cost);
- `sqlite FULL`: one INSERT of the same bytes per transaction, WAL, `synchronous=FULL`.

`in flush` is the time spent inside `os.fdatasync` / `os.fsync` (timed around each call;
SQLite flushes from C, unseen: `-`), the rest is everything else. `/ overwrite` is each
run's time over the same run's `overwrite` (the issue's target for `eventstore`: at most
1.3x), median and spread over the runs; `/ grow` is medians over `grow`'s median.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Literal

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


def _journal_calls(stat_lock: bool) -> Callable[[Path, int], Callable[[], None]]:
    """The system calls of one eventstore durable append (as `strace` counts them),
    without the rest of its work: lock, check, append to the log (unflushed), the
    same bytes into a preallocated mirror, flush that, write the hints, unlock;
    `stat_lock`: the lock file's identity checked by `lstat` rather than by asking
    where the descriptor points (which asks no file times)."""
    return partial(_journal_op, stat_lock)


def _journal_op(stat_lock: bool, d: Path, n: int) -> Callable[[], None]:
    log = os.open(d / "log", os.O_CREAT | os.O_RDWR | os.O_APPEND, 0o600)
    lock = os.open(d / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    mirror = os.open(d / "mirror", os.O_CREAT | os.O_RDWR, 0o600)
    os.write(lock, bytes(24))
    os.write(mirror, bytes(4096 + len(LINE) * (n + 1)))
    for fd in (lock, mirror):
        os.fsync(fd)
    at = [4096]

    def op() -> None:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.pread(lock, 24, 0)
        if stat_lock:
            os.lstat(d / "lock")
        else:
            os.readlink(f"/proc/self/fd/{lock}")
        os.readlink(f"/proc/self/fd/{log}")
        os.lseek(log, 0, os.SEEK_END)
        os.write(log, LINE)
        os.pwrite(mirror, LINE, at[0])
        os.fdatasync(mirror)
        os.pwrite(lock, at[0].to_bytes(24, "big"), 0)
        fcntl.flock(lock, fcntl.LOCK_UN)
        at[0] += len(LINE)

    return op


def _eventstore(durability: Literal["flush", "fsync"]) -> Callable[[Path, int], Callable[[], None]]:
    def make(d: Path, n: int) -> Callable[[], None]:
        from eventstore import SessionStore
        from eventstore.records import Message, Role

        store = SessionStore(d / "store", durability=durability)
        messages = [Message(role=Role.USER, content="x" * 1700)]
        store.append_transcript_messages("s", messages)

        def op() -> None:
            store.append_transcript_messages("s", messages)

        return op

    return make


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
    "journal calls": _journal_calls(stat_lock=False),
    "journal calls, lock stat'ed": _journal_calls(stat_lock=True),
    "eventstore": _eventstore("fsync"),
    "eventstore flush": _eventstore("flush"),
    "sqlite FULL": _sqlite,
}
FLUSHES_UNSEEN = {"sqlite FULL"}
"""Rows whose flushes are made in C, which `_timed_flushes` cannot see."""


@contextmanager
def _timed_flushes(spent: dict[str, float], row: list[str]) -> Iterator[None]:
    """Add the seconds spent in `os.fdatasync` and `os.fsync` to `spent[row[0]]`
    meanwhile (the wrapper's own cost, well under a microsecond, is in every row alike)."""
    real = {name: getattr(os, name) for name in ("fdatasync", "fsync")}

    def wrap(fn: Callable[[int], None]) -> Callable[[int], None]:
        def timed(fd: int) -> None:
            t0 = time.perf_counter()
            try:
                fn(fd)
            finally:
                spent[row[0]] += time.perf_counter() - t0

        return timed

    for name, fn in real.items():
        setattr(os, name, wrap(fn))
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


def _measure(
    repeat: int, n: int, where: str | None, paired: bool
) -> dict[str, list[tuple[float, float]]]:
    """Per row, per run: (µs per operation, µs of it inside the flush calls). Every run
    interleaves the rows, `n` operations of one after the other's, or with `paired` one
    operation of each in turn, so that every row meets the same disk (a shared one
    drifts within a run)."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ROWS}
    spent = dict.fromkeys([*ROWS, ""], 0.0)
    row = [""]  # the row whose flushes are being timed ("": setting up)
    with tempfile.TemporaryDirectory(dir=where) as tmp, _timed_flushes(spent, row):
        for r in range(repeat):
            ops = {}
            for name, make in ROWS.items():
                d = Path(tmp) / f"{r}-{name.replace(' ', '_')}"
                d.mkdir()
                ops[name] = make(d, n)
            total = dict.fromkeys(ROWS, 0.0)
            spent.update(dict.fromkeys(ROWS, 0.0))
            if paired:
                for _ in range(n):
                    for name, op in ops.items():
                        row[0] = name
                        t0 = time.perf_counter()
                        op()
                        total[name] += time.perf_counter() - t0
            else:
                for name, op in ops.items():
                    row[0] = name
                    t0 = time.perf_counter()
                    for _ in range(n):
                        op()
                    total[name] = time.perf_counter() - t0
            row[0] = ""
            for name in ROWS:
                times[name].append((total[name] / n * 1e6, spent[name] / n * 1e6))
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fsync_floor", description=__doc__)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument(
        "--paired", action="store_true", help="interleave every operation, not every run's rows"
    )
    args = ap.parse_args(argv)
    times = _measure(args.repeat, args.n, args.dir, args.paired)
    grow = statistics.median(t for t, _ in times["grow"])
    floor = [t for t, _ in times["overwrite"]]
    print(f"one durable operation, µs, medians (min-max) of {args.repeat} x {args.n}:\n")
    print("| row | µs per operation | spread | in flush | rest | / overwrite | spread | / grow |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, runs in times.items():
        med = statistics.median(t for t, _ in runs)
        ratios = [t / f for (t, _), f in zip(runs, floor, strict=True)]
        flush = "-" if name in FLUSHES_UNSEEN else f"{statistics.median(s for _, s in runs):,.0f}"
        rest = (
            "-" if name in FLUSHES_UNSEEN else f"{statistics.median(t - s for t, s in runs):,.0f}"
        )
        print(
            f"| {name} | {med:,.0f} | {min(t for t, _ in runs):,.0f}–{max(t for t, _ in runs):,.0f}"
            f" | {flush} | {rest} | {statistics.median(ratios):.2f}×"
            f" | {min(ratios):.2f}–{max(ratios):.2f} | {med / grow:.2f}× |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
