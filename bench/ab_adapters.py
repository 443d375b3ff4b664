"""`python -m bench.ab_adapters OLD_CHECKOUT [NEW_CHECKOUT] [--ops 2000] [--runs 7]`: the
per-call time of the Agents SDK's warm `pop_item` and the Claude Agent SDK's `append` by
two checkouts of eventstore, interleaved in fresh processes (file engine, flush).

Each run builds its session in a new directory (`--ops` `add_items` of one item, then a
whole `get_items()`; `--ops` `append` of one entry after a first) and times `--ops`
calls: wall time and the process's CPU time (CPU time moves less than wall time when
other work shares the machine). Prints medians and spreads (max/min) of each, NEW/OLD.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_RUN = """
import asyncio, json, sys, tempfile, time
sys.path.insert(0, {src!r})
from eventstore.integrations.claude_agent_sdk import EventStoreSessionStore
from eventstore.integrations.openai_agents import EventStoreSession

def clocks():
    return time.perf_counter(), time.process_time()

def per_call(t0, n):
    t1 = clocks()
    return [(t1[0] - t0[0]) / n * 1e6, (t1[1] - t0[1]) / n * 1e6]

async def main(n):
    out = {{}}
    with tempfile.TemporaryDirectory() as root:
        s = EventStoreSession("chat", root)
        for i in range(n):
            await s.add_items([{{"role": "user", "content": f"turn {{i}}"}}])
        await s.get_items()
        t0 = clocks()
        for _ in range(n):
            await s.pop_item()
        out["agents warm pop_item"] = per_call(t0, n)
        await s.close()
    with tempfile.TemporaryDirectory() as root:
        store = EventStoreSessionStore(root)
        key = {{"project_key": "bench", "session_id": "s"}}
        await store.append(key, [{{"type": "user", "uuid": "first"}}])
        t0 = clocks()
        for i in range(n):
            await store.append(key, [{{"type": "user", "uuid": f"u{{i}}"}}])
        out["claude append"] = per_call(t0, n)
        await store.close()
    print(json.dumps(out))

asyncio.run(main({ops}))
"""


def main() -> None:
    """Print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path, nargs="?", default=Path(__file__).parent.parent)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    got: dict[str, list[dict[str, list[float]]]] = {"old": [], "new": []}
    for r in range(args.runs):
        for side, src in (("old", args.old), ("new", args.new)):
            code = _RUN.format(src=str(src.resolve()), ops=args.ops)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
            got[side].append(json.loads(done.stdout))
        print(f"run {r + 1}/{args.runs}", file=sys.stderr)
    print("| call | clock | OLD µs | spread | NEW µs | spread | NEW/OLD |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for call in got["old"][0]:
        for i, clock in enumerate(("wall", "cpu")):
            old = [run[call][i] for run in got["old"]]
            new = [run[call][i] for run in got["new"]]
            mo, mn = statistics.median(old), statistics.median(new)
            print(
                f"| {call} | {clock} | {mo:.1f} | {max(old) / min(old):.2f} | {mn:.1f}"
                f" | {max(new) / min(new):.2f} | {mn / mo:.2f} |"
            )


if __name__ == "__main__":
    main()
