"""How large a session's archive grows under repeated compaction (issue 12 item 13).

    python -m bench.archive_growth [--turns 2000] [--processes 2] [--max-events 150]

`--processes` processes each append `--turns` turns (a 300- and a 1,500-character
message per turn) to one session of a fresh file store with
`AutoCompact(max_events=...)`, so compaction runs over and over beside live writers.
Prints the archive's files and bytes, the bytes of the event lines they hold (snapshot
lines excluded) and the ratio, and checks that `verify` is clean and `read_events`
yields every event once.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

from eventstore import (
    AutoCompact,
    Message,
    Role,
    SessionStore,
)

SID = "s"


def _writer(root: str, proc: int, turns: int, max_events: int) -> None:
    with SessionStore(root, auto_compact=AutoCompact(max_events=max_events)) as store:
        for t in range(turns):
            store.append_transcript_messages(
                SID,
                [
                    Message(role=Role.USER, content=f"{proc}.{t} " + "u" * 300),
                    Message(role=Role.ASSISTANT, content="a" * 1500),
                ],
            )


def measure(root: Path, turns: int, processes: int, max_events: int) -> dict[str, object]:
    """Run the writers on `root` and measure its archive (see the module docstring)."""
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_writer, args=(str(root), p, turns, max_events))
        for p in range(processes)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    seconds = time.perf_counter() - t0
    archive = root / "sessions" / SID / "archive"
    files = sorted(archive.glob("*.jsonl")) if archive.is_dir() else []
    total = sum(f.stat().st_size for f in files)
    events = sum(
        len(line)
        for f in files
        for line in f.read_bytes().splitlines(keepends=True)
        if not line.startswith(b'{"type":"snapshot"')
    )
    with SessionStore(root) as store:
        ok = store.verify(SID).ok
        seqs = [e.seq for e in store.read_events(SID)]
    return {
        "turns": turns,
        "processes": processes,
        "max_events": max_events,
        "archive_files": len(files),
        "archive_bytes": total,
        "event_bytes_in_archive": events,
        "ratio": round(total / max(events, 1), 3),
        "events_read": len(seqs),
        "each_once": seqs == list(range(1, len(seqs) + 1)),
        "verify_ok": ok,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.archive_growth")
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-events", type=int, default=150)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="archive-growth-") as tmp:
        result = measure(Path(tmp) / "store", args.turns, args.processes, args.max_events)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
