"""The Agents SDK's first call of a fresh process: `get_items(limit=20)` and `pop_item()`
on a long conversation, eventstore's `EventStoreSession` against `SQLiteSession`.

    python -m bench.agents_cold                        # 10,000 items, 7 repeats
    python -m bench.agents_cold --items 2000,10000 --repeat 9

Each backend's conversation (a user and an assistant item per turn, as in
`python -m bench.integrations`) is built once by a process of its own that closes its
session. Then every timed call runs in a fresh interpreter with the modules imported
(as a server has them: the file engine too, which the first `SessionStore` of a process
imports, ~5 ms), alternating the backends: it opens the session object (and,
for eventstore, its store) and makes one call, and reports that call's CPU and wall time
from the object's creation on. `bench.integrations` times the same calls in one process,
where `SQLiteSession` reuses the event loop's thread pool while eventstore's async store
starts its worker: this bench is the fresh process the issue's target is about.
The pops shorten each conversation by one item per repeat, alike on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fresh import run_module

BACKENDS = ("sqlite", "eventstore-flush")
CALLS = ("get_items(20)", "pop_item")


def _session(backend: str, root: Path) -> tuple[Any, Any]:
    from bench.integrations import agents_session
    from bench.places import Place

    return agents_session(backend, Place("file", root, str(root), None, ""), "chat")


async def _build(backend: str, root: Path, items: int) -> None:
    from bench.integrations import maybe_await, text

    rng = random.Random(13)
    s, close = _session(backend, root)
    for _ in range(items // 2):
        pair = [
            {"role": "user", "content": text(rng, 300)},
            {"role": "assistant", "content": text(rng, 1500)},
        ]
        await s.add_items(pair)
    await maybe_await(close())


async def _call(backend: str, root: Path, call: str) -> dict[str, float]:
    """One first call of this process, timed from the session object's creation."""
    import agents.memory  # noqa: F401 - imported before timing, as a server has

    import bench.integrations  # noqa: F401
    import eventstore.engines.file  # noqa: F401 - what `SessionStore(path)` imports first

    c, t = time.process_time(), time.perf_counter()
    s, close = _session(backend, root)
    if call == "pop_item":
        got: Any = await s.pop_item()
    else:
        got = await s.get_items(20)
    cpu, wall = time.process_time() - c, time.perf_counter() - t
    assert got, f"{backend}: {call} found no item"
    from bench.integrations import maybe_await

    await maybe_await(close())
    return {"cpu ms": cpu * 1e3, "wall ms": wall * 1e3}


def _child(*args: str) -> dict[str, float]:
    return run_module("bench.agents_cold", *args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "build":
        asyncio.run(_build(argv[1], Path(argv[2]), int(argv[3])))
        print("{}")
        return 0
    if argv and argv[0] == "call":
        print(json.dumps(asyncio.run(_call(argv[1], Path(argv[2]), argv[3]))))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.agents_cold", description=__doc__)
    ap.add_argument("--items", default="10000")
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="eventstore-agentscold-"))
    runs: dict[tuple[int, str, str], list[dict[str, float]]] = {}
    try:
        for items in map(int, a.items.split(",")):
            for backend in BACKENDS:
                (base / f"{backend}-{items}").mkdir()
                _child("build", backend, str(base / f"{backend}-{items}"), str(items))
            for r in range(a.repeat):
                for call in CALLS:
                    for backend in BACKENDS:  # interleaved within each repeat
                        root = str(base / f"{backend}-{items}")
                        runs.setdefault((items, call, backend), []).append(
                            _child("call", backend, root, call)
                        )
                print(f"repeat {r + 1}: {items} items", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(_table(runs))
    return 0


def _table(runs: dict[tuple[int, str, str], list[dict[str, float]]]) -> str:
    lines = [
        "| items | call | backend | cpu ms | wall ms | × SQLite cpu (spread) | × SQLite wall |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for (items, call, backend), figs in runs.items():
        base = runs[(items, call, "sqlite")]
        cells = []
        for col in ("cpu ms", "wall ms"):
            ratios = sorted(b[col] / f[col] for f, b in zip(figs, base, strict=True))
            cells.append((statistics.median(ratios), ratios[0], ratios[-1]))
        cpu = statistics.median(f["cpu ms"] for f in figs)
        wall = statistics.median(f["wall ms"] for f in figs)
        (rc, lo, hi), (rw, _, _) = cells
        lines.append(
            f"| {items:,} | {call} | {backend} | {cpu:.2f} | {wall:.2f} "
            f"| {rc:.2f} ({lo:.2f}-{hi:.2f}) | {rw:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
