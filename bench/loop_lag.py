"""Event-loop lag while the async store appends: figures, never a verdict.

    python -m bench.loop_lag [--appends 1000] [--sessions 8] [--repeat 3]

A 1 ms ticker runs on the event loop while `AsyncSessionStore` runs APPENDS appends (one
progress event each, spread over SESSIONS sessions) from one `asyncio.gather`; every
tick's lateness is the loop's lag. A store that blocked the loop would lag by the whole
run; one that keeps its work on worker threads lags by a tick or two. Printed: ticks,
median, p99 and max lag, and the appends' wall time. On a shared machine the figures
move with the load: compare runs made side by side, never against a fixed bound.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from eventstore import ProgressEntry
from eventstore.aio import AsyncSessionStore
from eventstore.format.events import ProgressAppended


def loop_lag_while_appending(root: Path, appends: int, sessions: int) -> tuple[list[float], float]:
    """Lags (seconds) of a 1 ms ticker on the loop while `appends` appends run, and the
    appends' wall time."""

    async def main() -> tuple[list[float], float]:
        lags: list[float] = []
        done = asyncio.Event()

        async def probe() -> None:
            while not done.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - t - 0.001)

        async with AsyncSessionStore(root) as store:
            ticker = asyncio.ensure_future(probe())
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    store.append(
                        f"s{i % sessions}",
                        [ProgressAppended(entry=ProgressEntry(run_id="r", summary=f"note {i}"))],
                    )
                    for i in range(appends)
                )
            )
            elapsed = time.perf_counter() - t0
            done.set()
            await ticker
        return lags, elapsed

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.loop_lag", description=__doc__)
    ap.add_argument("--appends", type=int, default=1000)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    print(
        f"event-loop lag of a 1 ms ticker while {a.appends} appends run ({a.sessions} sessions)\n"
    )
    print("| run | ticks | median ms | p99 ms | max ms | appends s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for run in range(1, a.repeat + 1):
        with tempfile.TemporaryDirectory() as root:
            lags, elapsed = loop_lag_while_appending(Path(root), a.appends, a.sessions)
        lags.sort()
        if lags:
            p99 = lags[max(int(len(lags) * 0.99) - 1, 0)]
            row = f"{statistics.median(lags) * 1e3:.2f} | {p99 * 1e3:.2f} | {lags[-1] * 1e3:.2f}"
        else:
            row = "- | - | -"
        print(f"| {run} | {len(lags)} | {row} | {elapsed:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
