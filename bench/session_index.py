"""The session index: the newest 20 of 50,000 sessions, against the scans it replaces.

    .venv/bin/python -m bench.session_index [--sessions 50000] [--page 20] [--repeat 15]
        [--engines file,memory,postgres,redis]

Builds a store of SESSIONS sessions (one progress entry each, then a label on every
tenth) per engine, then measures, each on a fresh `SessionStore` (no state in memory;
the OS page cache and the server's cache warm, as for any process opening a store
another one writes):

- page: `store.sessions(limit=PAGE)`, the newest written first, from the index;
- page+label: the same, filtered by a label one session in ten carries;
- list ids: `store.list_sessions()`, the old call: every id, sorted, nothing else;
- scan newest: the same page as `page`, computed by reading every session (what
  `sessions` does for an engine without an index, and what a caller of
  `list_sessions()` had to do for it): REPEAT // 5 runs, at least 2.

Medians and spreads (min..max) in milliseconds, printed as a markdown table. PostgreSQL
and Redis run when EVENTSTORE_TEST_POSTGRES_URL / EVENTSTORE_TEST_REDIS_URL name a server
(each in a schema or key prefix of its own, dropped after).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from eventstore import ProgressEntry, SessionStore
from eventstore.ops.listing import page_of, scan


def _url(engine: str, tmp: Path) -> str | None:
    if engine == "file":
        return str(tmp / "store")
    if engine == "memory":
        return f"memory://bench-{uuid.uuid4().hex}"
    if engine == "postgres":
        base = os.environ.get("EVENTSTORE_TEST_POSTGRES_URL")
        if not base:
            return None
        sep = "&" if "?" in base else "?"
        return f"{base}{sep}schema=bench_{uuid.uuid4().hex[:12]}"
    if engine == "redis":
        base = os.environ.get("EVENTSTORE_TEST_REDIS_URL")
        if not base:
            return None
        sep = "&" if "?" in base else "?"
        return f"{base}{sep}prefix=bench-{uuid.uuid4().hex[:12]}"
    raise SystemExit(f"unknown engine {engine!r}")


def _build(url: str, n: int) -> None:
    with SessionStore(url) as store:
        entry = ProgressEntry("bench", "one step")
        for i in range(n):
            store.append_progress_entry(f"session-{i:06d}", entry)
            if i % 10 == 0:
                store.set_labels(f"session-{i:06d}", {"team": "red"})
            if i % 5000 == 4999:
                print(f"  built {i + 1}", file=sys.stderr)


def _times(url: str, fn: Callable[[SessionStore], object], repeat: int) -> list[float]:
    out: list[float] = []
    for _ in range(repeat):
        with SessionStore(url) as store:
            t = time.perf_counter()
            fn(store)
            out.append((time.perf_counter() - t) * 1000)
    return out


def _cell(ms: list[float]) -> str:
    return f"{statistics.median(ms):,.2f} ({min(ms):,.2f}..{max(ms):,.2f})"


def main(argv: list[str] | None = None) -> int:
    """Build, measure, print the table."""
    p = argparse.ArgumentParser(prog="python -m bench.session_index")
    p.add_argument("--sessions", type=int, default=50_000)
    p.add_argument("--page", type=int, default=20)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--engines", default="file,memory,postgres,redis")
    args = p.parse_args(argv)
    rows = []
    k = args.page
    for engine in args.engines.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            url = _url(engine, Path(tmp))
            if url is None:
                print(f"{engine}: no server given, skipped", file=sys.stderr)
                continue
            print(f"{engine}: building {args.sessions} sessions", file=sys.stderr)
            t = time.perf_counter()
            _build(url, args.sessions)
            build_s = time.perf_counter() - t
            keep = SessionStore(url) if engine == "memory" else None  # (a named store lives on)
            page = _times(url, lambda s: s.sessions(limit=k), args.repeat)
            labelled = _times(
                url, lambda s: s.sessions(limit=k, labels={"team": "red"}), args.repeat
            )
            ids = _times(url, lambda s: s.list_sessions(), args.repeat)
            scanned = _times(
                url,
                lambda s: page_of(scan(s.core), "updated", None, k, None, None, {}),
                max(2, args.repeat // 5),
            )
            with SessionStore(url) as store:
                same = [i.session_id for i in store.sessions(limit=k)] == [
                    e.session_id
                    for e in page_of(scan(store.core), "updated", None, k, None, None, {})
                ]
                if engine in ("postgres", "redis"):
                    for sid in store.list_sessions():
                        store.delete_session(sid)
            if keep is not None:
                keep.close()
            rows.append((engine, build_s, page, labelled, ids, scanned, same))
    print(f"\n{args.sessions:,} sessions, a page of {args.page}; ms: median (min..max)\n")
    heads = ["engine", "page", "page+label", "list ids (old)", "scan newest (old)"]
    print("| " + " | ".join([*heads, "page = scan", "build s"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for engine, build_s, page, labelled, ids, scanned, same in rows:
        ratio = statistics.median(scanned) / statistics.median(page)
        print(
            f"| {engine} | {_cell(page)} | {_cell(labelled)} | {_cell(ids)} |"
            f" {_cell(scanned)} (×{ratio:,.0f}) | {same} | {build_s:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
