"""The measuring side of the benchmark: one backend, one size, in its own process.

`python -m bench.worker MODE JSON` prints one JSON object. Modes:

- `write`: build a session from the workload (timed), then measure bytes on disk, a
  cold load in a fresh process (`cold`), and warm loads after k events appended by
  another store instance; for eventstore also the bare `decode_lines` ceiling.
- `cold`: in this (fresh) process, time the first `load_bootstrap_state`, then with a
  new store instance the first `load_transcript_messages`; report peak RSS.
- `compact`: an eventstore session of N events: cold loads before and after
  `store.compact(sid)`.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

SID = "bench-session"


def _peak_rss_mb() -> float:
    """This process's peak RSS. Linux: VmHWM, the high-water mark of this process's own
    memory; `ru_maxrss` is not: it keeps the peak of the parent at the fork across the
    exec, so a cold-load process started by a writer that had read a whole log reported
    the writer's peak (eventstore's writer measures the decode ceiling; sqlite's does not)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _disk_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except FileNotFoundError:
                pass
    return total


def _cold_subprocess(backend: str, root: str, timeout: float) -> dict[str, Any]:
    args = json.dumps({"backend": backend, "root": root})
    proc = subprocess.run(
        [sys.executable, "-m", "bench.worker", "cold", args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _log_path(root: str) -> Path:
    from eventstore.engines.file.layout import SessionPaths

    return SessionPaths(Path(root), SID).log


def _bare_decode(log: Path, runs: int = 5) -> dict[str, float]:
    """Median seconds of `decode_lines` over the log's bytes: the full event union, and
    the decoder eventstore uses for the bootstrap projection (other types stubbed)."""
    import msgspec

    from eventstore.format.codec import EventCodec
    from eventstore.format.events import BUILTIN_EVENT_TYPES
    from projections import BootstrapProjection

    data = log.read_bytes()
    union: Any = BUILTIN_EVENT_TYPES[0]
    for t in BUILTIN_EVENT_TYPES[1:]:
        union = union | t
    full = msgspec.json.Decoder(union)
    stub = EventCodec().decoder(BootstrapProjection.event_types)
    out: dict[str, float] = {}
    for name, dec in (("full", full), ("stub", stub)):
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            dec.decode_lines(data)
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
    return out


def _warm_after(backend: str, root: str, wl: Any, k: int) -> float:
    """Seconds of a reader's load_bootstrap_state after another instance appended k ops."""
    from .backends import open_backend
    from .workload import apply_op

    reader = open_backend(backend, root)
    writer = open_backend(backend, root)
    try:
        reader.load_bootstrap_state(SID)
        for op in wl.more_ops(k):
            apply_op(writer, SID, op)
        t = time.perf_counter()
        reader.load_bootstrap_state(SID)
        return time.perf_counter() - t
    finally:
        writer.close()
        reader.close()


def write_mode(a: dict[str, Any]) -> dict[str, Any]:
    """Build the session (timed) and measure everything else on it."""
    from .backends import open_backend
    from .workload import Workload, apply_op

    backend, turns = a["backend"], a["turns"]
    wl = Workload(turns, seed=a.get("seed", 7), msg_scale=a.get("msg_scale", 1.0))
    root = tempfile.mkdtemp(prefix=f"bench-{backend}-", dir=a.get("tmp"))
    try:
        store = open_backend(backend, root)
        t = time.perf_counter()
        for op in wl.ops:
            apply_op(store, SID, op)
        write_s = time.perf_counter() - t
        t = time.perf_counter()
        store.close()  # (eventstore saves its fold caches here)
        close_s = time.perf_counter() - t
        res: dict[str, Any] = {
            "backend": backend,
            "turns": turns,
            "ops": len(wl.ops),
            "write_s": write_s,
            "write_ops_s": len(wl.ops) / write_s,
            "close_s": close_s,
            "disk_bytes": _disk_bytes(root),
            "writer_rss_mb": _peak_rss_mb(),
        }
        if backend.startswith("eventstore") and a.get("ceiling", True):
            log = _log_path(root)
            res["log_bytes"] = log.stat().st_size
            res["bare_decode_s"] = _bare_decode(log)
        colds = [
            _cold_subprocess(backend, root, a.get("timeout", 300))
            for _ in range(a.get("cold_runs", 1))
        ]
        res["cold_bootstrap_s"] = statistics.median(c["bootstrap_s"] for c in colds)
        res["cold_transcript_s"] = statistics.median(c["transcript_s"] for c in colds)
        res["cold_rss_mb"] = statistics.median(c["rss_mb"] for c in colds)
        res["warm"] = {str(k): _warm_after(backend, root, wl, k) for k in a.get("warm_k", [10])}
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)


def cold_mode(a: dict[str, Any]) -> dict[str, Any]:
    """First loads in a fresh process (modules imported, nothing cached by the store)."""
    from .backends import open_backend

    store = open_backend(a["backend"], a["root"])
    t = time.perf_counter()
    state = store.load_bootstrap_state(SID)
    bootstrap_s = time.perf_counter() - t
    store.close()
    assert state.manifest is not None, "cold load found no session"
    store = open_backend(a["backend"], a["root"])
    t = time.perf_counter()
    messages = store.load_transcript_messages(SID)
    transcript_s = time.perf_counter() - t
    store.close()
    return {
        "bootstrap_s": bootstrap_s,
        "transcript_s": transcript_s,
        "messages": len(messages),
        "rss_mb": _peak_rss_mb(),
    }


def compact_mode(a: dict[str, Any]) -> dict[str, Any]:
    """Cold loads of an N-event eventstore session before and after compaction."""
    from eventstore import SessionStore

    from .workload import Workload, apply_op

    events, runs = a["events"], a.get("cold_runs", 3)
    wl = Workload(0, seed=a.get("seed", 7), msg_scale=a.get("msg_scale", 1.0))
    root = tempfile.mkdtemp(prefix="bench-compact-", dir=a.get("tmp"))
    try:
        store = SessionStore(root)
        apply_op(store, SID, wl.ops[0])
        t = time.perf_counter()
        while store.last_seq(SID) < events:
            n = min(5_000, events - store.last_seq(SID))
            for op in wl.more_ops(n):
                apply_op(store, SID, op)
        build_s = time.perf_counter() - t
        n_events = store.last_seq(SID)
        store.close()
        log = _log_path(root)
        res: dict[str, Any] = {
            "events": n_events,
            "msg_scale": a.get("msg_scale", 1.0),
            "retention": a.get("retention"),
            "build_s": build_s,
            "log_bytes_before": log.stat().st_size,
            "bare_decode_before_s": _bare_decode(log, 3),
        }
        before = [_cold_subprocess("eventstore-flush", root, 600) for _ in range(runs)]
        res["cold_bootstrap_before_s"] = statistics.median(c["bootstrap_s"] for c in before)
        res["cold_transcript_before_s"] = statistics.median(c["transcript_s"] for c in before)
        store = SessionStore(root)
        t = time.perf_counter()
        retention = None
        if a.get("retention"):
            from eventstore.ops.compaction import Retention

            retention = Retention(**a["retention"])
        report = store.compact(SID, retention=retention)
        res["compact_s"] = time.perf_counter() - t
        store.close()
        res["report"] = {
            f: getattr(report, f)
            for f in ("events_before", "events_after", "bytes_before", "bytes_after", "seconds")
            if hasattr(report, f)
        }
        res["log_bytes_after"] = log.stat().st_size
        res["bare_decode_after_s"] = _bare_decode(log, 3)
        after = [_cold_subprocess("eventstore-flush", root, 600) for _ in range(runs)]
        res["cold_bootstrap_after_s"] = statistics.median(c["bootstrap_s"] for c in after)
        res["cold_transcript_after_s"] = statistics.median(c["transcript_s"] for c in after)
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run one mode and print its JSON result."""
    argv = sys.argv[1:] if argv is None else argv
    mode, args = argv[0], json.loads(argv[1])
    fn = {"write": write_mode, "cold": cold_mode, "compact": compact_mode}[mode]
    print(json.dumps(fn(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
