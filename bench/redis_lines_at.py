"""How the Redis engine's read of lines by seq scales with the lines one element of the
live log holds (a big batch, or a repair's rewrite that makes the whole log one element):
the time per line read at each size, and its ratio to the smallest size's, which stays
near 1 while the script is linear (a script that counted each seq's newlines from the
element's start took ~12 s for 16,000 lines and grew with their square).

    python -m bench.redis_lines_at [--url URL] [--lines 4000,16000,64000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from bench import server_url
from bench.places import drop_keys, with_prefix


def _per_line_us(url: str, lines: int) -> float:
    from eventstore import SessionStore
    from eventstore.format.events import ProgressAppended
    from eventstore.records import ProgressEntry

    entry = ProgressEntry(run_id="bench", summary="step")
    with SessionStore(url) as store:
        store.append("big", [ProgressAppended(entry=entry) for _ in range(lines)])
        started = time.perf_counter()
        got = store.engine.lines_at("big", range(1, lines + 1))
        took = time.perf_counter() - started
    assert len(got) == lines, f"{len(got)} of {lines} lines read by seq"
    return took / lines * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.redis_lines_at", description=__doc__)
    ap.add_argument("--url")
    ap.add_argument("--lines", default="4000,16000,64000")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    url = server_url(ap, a.url, "REDIS")
    sizes = [int(n) for n in a.lines.split(",")]
    runs: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(a.repeat):
        for n in sizes:  # interleaved: each repeat goes through every size
            prefix = f"bench-lines-at-{uuid.uuid4().hex[:8]}"
            try:
                runs[n].append(_per_line_us(with_prefix(url, prefix), n))
            finally:
                drop_keys(url, prefix)
    first = statistics.median(runs[sizes[0]])
    print("| lines in one element | µs a line (min-max) | × the smallest size's |")
    print("|---:|---:|---:|")
    for n in sizes:
        med = statistics.median(runs[n])
        print(f"| {n:,} | {med:.2f} ({min(runs[n]):.2f}-{max(runs[n]):.2f}) | {med / first:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
