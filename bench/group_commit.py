"""Durable appends with many writers: do they share a flush (group commit)?

    python -m bench.group_commit [--n 200] [--repeat 5] [--writers 8] [--dir DIR]

Durable operations per second, medians (and min-max spreads) of `--repeat` runs, the
rows interleaved in every run so drift hits them alike. Every writer is a thread of this
process, started together at a barrier; each makes `--n` operations of ~1,900 bytes:

- `overwrite floor`: one thread, a write into a preallocated file then `fdatasync`
  (`bench.fsync_floor`'s floor: what any store's one durable operation costs here);
- `eventstore 1 writer`: `append_transcript_messages` of `SessionStore(durability="fsync")`;
- `eventstore W on 1 session`: W threads appending to one session of one store;
- `eventstore W on W sessions`: W threads, each on a session of its own, one store;
- `sqlite FULL W writers`: W threads, a connection each, one INSERT per transaction,
  WAL, `synchronous=FULL`, `busy_timeout` 60 s.

Ratios: the eventstore rows against `sqlite FULL W writers` (above 1: eventstore does
more durable operations per second), and the one writer's time per append against the
floor's (the issue's target: at most 1.3x).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

LINE = b"x" * 1899 + b"\n"

Op = Callable[[], None]


def _floor(d: Path, writers: int, n: int) -> list[Op]:
    fd = os.open(d / "overwrite.log", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    os.write(fd, b"\0" * (len(LINE) * (n + 1)))
    os.fsync(fd)
    os.lseek(fd, 0, os.SEEK_SET)

    def op() -> None:
        os.write(fd, LINE)
        os.fdatasync(fd)

    return [op]


def _eventstore(sessions: int, writers: int) -> Callable[[Path, int, int], list[Op]]:
    def make(d: Path, _writers: int, n: int) -> list[Op]:
        from eventstore import SessionStore
        from eventstore.records import Message, Role

        store = SessionStore(d / "store", durability="fsync")
        messages = [Message(role=Role.USER, content="x" * 1700)]
        sids = [f"s{i}" for i in range(sessions)]
        for sid in sids:
            store.append_transcript_messages(sid, messages)

        def op_for(sid: str) -> Op:
            return lambda: store.append_transcript_messages(sid, messages)

        return [op_for(sids[w % sessions]) for w in range(writers)]

    return make


def _sqlite(d: Path, writers: int, n: int) -> list[Op]:
    path = d / "full.db"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE IF NOT EXISTS t (v BLOB)")
    setup.close()
    text = LINE.decode()

    def op_for() -> Op:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=60000")

        def op() -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (?)", (text,))
            db.execute("COMMIT")

        return op

    return [op_for() for _ in range(writers)]


def _run(ops: list[Op], n: int) -> float:
    """Operations per second of every op in `ops` run `n` times, each in its thread."""
    gate = threading.Barrier(len(ops) + 1)
    errors: list[BaseException] = []

    def work(op: Op) -> None:
        gate.wait()
        try:
            for _ in range(n):
                op()
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(op,)) for op in ops]
    for t in threads:
        t.start()
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return len(ops) * n / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.group_commit", description=__doc__)
    ap.add_argument("--n", type=int, default=200, help="operations per writer per run")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args(argv)
    w = args.writers
    rows: dict[str, tuple[Callable[[Path, int, int], list[Op]], int]] = {
        "overwrite floor": (_floor, 1),
        "eventstore 1 writer": (_eventstore(1, 1), 1),
        f"eventstore {w} on 1 session": (_eventstore(1, w), w),
        f"eventstore {w} on {w} sessions": (_eventstore(w, w), w),
        f"sqlite FULL {w} writers": (_sqlite, w),
    }
    rates: dict[str, list[float]] = {name: [] for name in rows}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.repeat):
            for name, (make, writers) in rows.items():
                d = Path(tmp) / f"{r}-{name.replace(' ', '_')}"
                d.mkdir()
                rates[name].append(_run(make(d, writers, args.n), args.n))
    sqlite = statistics.median(rates[f"sqlite FULL {w} writers"])
    floor = statistics.median(rates["overwrite floor"])
    print(f"durable operations per second, medians (min-max) of {args.repeat} runs,")
    print(f"{args.n} operations per writer:\n")
    print(f"| row | ops/s | spread | × sqlite FULL {w} | time / floor |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in rates.items():
        med = statistics.median(rs)
        per_op = f"{floor / med:.2f}×" if rows[name][1] == 1 else ""
        spread = f"{min(rs):,.0f}–{max(rs):,.0f}"
        print(f"| {name} | {med:,.0f} | {spread} | {med / sqlite:.2f}× | {per_op} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
