"""Memory of a long-running process that reads many sessions once each.

    python -m bench.many_sessions --sessions 10000 --repeat 3

Builds `--sessions` small sessions (a manifest, 3 features, 2 progress entries, a
message) on eventstore (files, flush) and on stdlib sqlite3 (`sqlite-normal`, one
database), then, in a fresh process per backend and repeat (interleaved), opens the
store, loads each session's bootstrap state and transcript once, and reports the growth
of the process's resident memory (VmRSS, after a `gc.collect()`) over that pass, with the
store still open (what a server holding one store for its life keeps). eventstore runs
with its default `cached_sessions=1000` (`--cached-sessions N`: another bound, to see what
the default costs).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.backends import open_backend

__all__ = ["main"]

BACKENDS = ("eventstore-flush", "sqlite-normal")


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _make_sessions(backend: str, root: Path, n: int) -> None:
    """`n` small sessions through the session API."""
    from eventstore.records import (
        FeatureRecord,
        Message,
        ProgressEntry,
        Role,
        SessionManifest,
    )

    store = open_backend(backend, root)
    try:
        for i in range(n):
            sid = f"s{i:05d}"
            manifest = SessionManifest(
                session_id=sid, active_branch="main", current_objective=f"objective {i}"
            )
            features = [
                FeatureRecord(
                    id=f"f{j}", category="c", description="d" * 80, steps=["a"], passes=False
                )
                for j in range(3)
            ]
            store.initialize_session_if_missing(sid, manifest, features)
            for k in range(2):
                store.append_progress_entry(sid, ProgressEntry(run_id=f"r{k}", summary="p" * 80))
            store.append_transcript_messages(sid, [Message(role=Role.USER, content="m" * 200)])
    finally:
        store.close()


def _read_once(backend: str, root: str, n: int, out: Any, cached: int | None) -> None:
    if cached is not None and backend == "eventstore-flush":
        from eventstore import SessionStore

        store: Any = SessionStore(root, cached_sessions=cached)
    else:
        store = open_backend(backend, root)
    store.load_bootstrap_state("s00000")  # the store's own start-up outside the count
    store.load_transcript_messages("s00000")
    gc.collect()
    before = _rss_kb()
    for i in range(n):
        sid = f"s{i:05d}"
        store.load_bootstrap_state(sid)
        store.load_transcript_messages(sid)
    gc.collect()
    out.put((_rss_kb() - before) / 1024)
    store.close()


def main(argv: list[str] | None = None) -> int:
    """Build the sessions once per backend, then measure interleaved repeats."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cached-sessions", type=int, default=None)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="eventstore-many-"))
    try:
        roots = {}
        for backend in BACKENDS:
            roots[backend] = tmp / backend
            _make_sessions(backend, roots[backend], a.sessions)
            print(f"built {a.sessions} sessions on {backend}", file=sys.stderr)
        ctx = mp.get_context("spawn")
        growth: dict[str, list[float]] = {b: [] for b in BACKENDS}
        for _ in range(a.repeat):
            for backend in BACKENDS:
                q = ctx.Queue()
                p = ctx.Process(
                    target=_read_once,
                    args=(backend, str(roots[backend]), a.sessions, q, a.cached_sessions),
                )
                p.start()
                growth[backend].append(q.get(timeout=600))
                p.join(60)
                print(f"{backend}: +{growth[backend][-1]:.1f} MB", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(growth["sqlite-normal"])
    print(f"RSS growth reading {a.sessions:,} sessions once each, medians of {a.repeat}:\n")
    print("| backend | RSS growth MB (min-max) | × sqlite3 |")
    print("|---|---:|---:|")
    for backend, gs in growth.items():
        med = statistics.median(gs)
        ratio = f"{med / base:.2f}" if base > 0 else "-"
        print(f"| {backend} | {med:.1f} ({min(gs):.1f}-{max(gs):.1f}) | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
