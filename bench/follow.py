"""Follow latency, measured the same way on every engine: one writer appends a progress
entry every 5 ms, a follower in a thread of the same process times each wake-up."""

from __future__ import annotations

import threading
import time

SUMMARY = "x" * 100  # a progress entry of ~150 bytes: a typical harness note


def follow_latency(url: str, events: int) -> list[float]:
    """Seconds from each append to its arrival at a follower of the store at ``url``."""
    from eventstore import ProgressEntry, SessionStore

    sent: dict[str, float] = {}
    seen: list[float] = []
    stop = threading.Event()
    writer = SessionStore(url)
    writer.append_progress_entry("f", ProgressEntry(run_id="start", summary="start"))
    follower = SessionStore(url)
    ready = threading.Event()

    def follow() -> None:
        it = follower.follow("f", from_seq=2, stop=stop)
        ready.set()
        for ev in it:
            t = time.perf_counter()
            run_id = ev.entry.run_id  # type: ignore[attr-defined]
            if run_id in sent:
                seen.append(t - sent[run_id])
            if len(seen) >= events:
                return

    th = threading.Thread(target=follow, daemon=True)
    th.start()
    ready.wait(30)
    time.sleep(0.5)  # the follower is waiting, not catching up
    try:
        for i in range(events):
            sent[f"e{i}"] = time.perf_counter()
            writer.append_progress_entry("f", ProgressEntry(run_id=f"e{i}", summary=SUMMARY))
            time.sleep(0.005)
        th.join(60)
    finally:
        stop.set()
        writer.close()
        follower.close()
    return seen


def percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]
