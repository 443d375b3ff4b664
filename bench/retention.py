"""Bytes on disk for a LangGraph store with and without a retention policy (issue 32 item 2).

    python -m bench.retention [--threads 1000] [--turns 100] [--json out.json]

Writes `--threads` LangGraph threads of `--turns` checkpoints each (one 1,000-character
channel value per checkpoint, through `eventstore.integrations.langgraph.EventStoreSaver`
on a fresh file store; the first half of the threads written with the clock 60 days
back, the documented `entropy.fixed` hook, so they are idle), then measures the bytes
of every file under the store:

- `none`: no policy;
- `policy`: `SessionStore(retention=Policy(keep_events=K, archive_older_than=0s))`
  (compacted as written, archives pruned at each compaction);
- `policy+gc`: the same, then `gc(Policy(idle=30d, ...))` tombstones the idle half.

Also checks that every thread kept reads its last checkpoint and verifies.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.workload import put_values
from eventstore import Policy, SessionStore, entropy
from eventstore.integrations import langgraph as lg

__all__ = ["main"]


def _bytes(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def _thread(saver: Any, tid: str, values: list[str]) -> str:
    put_values(saver, tid, values)
    return values[-1]


def _run(config: str, threads: int, turns: int, keep: int) -> dict[str, Any]:
    rng = random.Random(5)
    alphabet = string.ascii_letters + " "
    policy = None if config == "none" else Policy(keep_events=keep, archive_older_than=timedelta(0))
    long_ago = datetime.now(UTC) - timedelta(days=60)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        store = SessionStore(
            root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS, retention=policy
        )
        saver = lg.EventStoreSaver(store)
        last: dict[str, str] = {}
        t0 = time.perf_counter()
        for i in range(threads):
            values = ["".join(rng.choices(alphabet, k=1000)) for _ in range(turns)]
            if i < threads // 2:
                with entropy.fixed(i, start=long_ago, step=timedelta(seconds=1)):
                    last[f"t{i}"] = _thread(saver, f"t{i}", values)
            else:
                last[f"t{i}"] = _thread(saver, f"t{i}", values)
        write_s = time.perf_counter() - t0
        gc_s = 0.0
        tombstoned = 0
        if config == "policy+gc":
            assert policy is not None
            t0 = time.perf_counter()
            report = store.gc(Policy(idle=timedelta(days=30), keep_events=keep,
                                     archive_older_than=timedelta(0)))  # fmt: skip
            gc_s = time.perf_counter() - t0
            tombstoned = len(report.tombstoned)
            assert not report.failed, report.failed
        kept = store.list_sessions()
        for sid in kept[:: max(1, len(kept) // 20)]:  # a sample: verify and read back
            assert store.verify(sid).ok, sid
        store.close()
        size, files = _bytes(root)
        fresh = SessionStore(root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS)
        reader = lg.EventStoreSaver(fresh)
        for tid in list(last)[:: max(1, threads // 20)]:
            tup = reader.get_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": ""}})
            if tombstoned and int(tid[1:]) < threads // 2:
                assert tup is None, tid
            else:
                assert tup is not None and tup.checkpoint["channel_values"]["v"] == last[tid]
        fresh.close()
    return {
        "config": config,
        "bytes": size,
        "files": files,
        "tombstoned": tombstoned,
        "write_s": round(write_s, 2),
        "gc_s": round(gc_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the three configurations and print a table (and JSON with --json)."""
    ap = argparse.ArgumentParser(prog="python -m bench.retention")
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--keep-events", type=int, default=20)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    rows = [_run(c, args.threads, args.turns, args.keep_events)
            for c in ("none", "policy", "policy+gc")]  # fmt: skip
    base = rows[0]["bytes"]
    print(f"{args.threads} threads x {args.turns} checkpoints, keep_events={args.keep_events}")
    head = ("config", "bytes", "vs none", "files", "tomb", "write s", "gc s")
    print("{:<10} {:>13} {:>8} {:>7} {:>5} {:>8} {:>6}".format(*head))
    for r in rows:
        print(f"{r['config']:<10} {r['bytes']:>13,} {r['bytes'] / base:>8.3f} {r['files']:>7}"
              f" {r['tombstoned']:>5} {r['write_s']:>8} {r['gc_s']:>6}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
