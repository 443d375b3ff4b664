"""Integrations bench: eventstore against LangGraph's, the Agents SDK's, ADK's and the
Claude Agent SDK's own backends.

Each framework runs on eventstore and on its own SQLite default, on the same machine in
the same run.

    pip install -e '.[bench]'
    python -m bench.integrations                    # ~1-3 min; markdown to stdout
    python -m bench.integrations --turns 50 --repeat 3 --json out.json

Workloads (seeded, identical for every backend):
- **LangGraph graph turns**: a one-node chat graph (`messages` is an appended list
  channel), one `invoke` per turn with a ~300-character user message and a
  ~1,500-character reply; sync API, one thread.
- **LangGraph put / get**: `put` of a checkpoint chain (one ~1 kB channel value per
  checkpoint), then `get_tuple` of the newest checkpoint from a new saver instance
  (cold) and again (warm), and `list` of the whole thread (eventstore: the first read
  of the full index in that saver); then, from another new saver, `get_tuple` of the
  checkpoint in the middle of the chain (cold, named by id: eventstore reads the full
  index, not the head).
- **Agents SDK session**: `add_items` of a user and an assistant item per turn, then
  `get_items()` from a new session object (cold), again (warm), and `get_items(10)`;
  `get_items(20)` and `pop_item()`, each the first call of a new session object on a
  new store (cold: what a fresh process pays, modules imported); on that object, after a
  whole `get_items()`, 100 more `pop_item()` (warm: the time of one, averaged; the disk
  figures include them); then `clear_session()` (eventstore: and
  `compact(archive=False)`), and the disk again.

- **ADK session service**: `append_event` of a ~300-character event (with a session
  state delta) to one session, `--adk-events` of them (500), then
  `get_session(num_recent_events=20)` from a new service (cold) and again (warm), and
  the whole session. Against ADK's `SqliteSessionService` and `DatabaseSessionService`
  (`sqlite+aiosqlite`), both on a file with SQLite's defaults (every commit fsynced).
- **Claude Agent SDK store**: `append` of one batch of two ~1 kB entries per turn, then
  `load` (from a new store object for eventstore: cold). Against the SDK's
  `InMemorySessionStore` (no durability at all: a floor, not a rival).

Backends: `SqliteSaver` / `SQLiteSession` on a file (WAL, SQLite's default
`synchronous=FULL`, so every commit is fsynced), and eventstore with
`durability="fsync"` (the same class: survives power loss) and `"flush"` (the default:
survives a killed process). Ratios are against SQLite; above 1 eventstore is better.
Medians over `--repeat` runs; every run starts from an empty directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from agents.memory import SQLiteSession
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from bench.adk_workload import adk_session_bench, text
from bench.workload import put_values
from eventstore import SessionStore
from eventstore.aio import AsyncSessionStore
from eventstore.integrations import langgraph as lg
from eventstore.integrations import openai_agents as oa

BACKENDS = ("sqlite", "eventstore-fsync", "eventstore-flush")


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def durability(backend: str) -> Any:
    return "fsync" if backend == "eventstore-fsync" else "flush"


# -- LangGraph ---------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def lg_saver(backend: str, root: Path) -> tuple[BaseCheckpointSaver[Any], Callable[[], None]]:
    if backend == "sqlite":
        conn = sqlite3.connect(root / "checkpoints.sqlite", check_same_thread=False)
        return SqliteSaver(conn), conn.close
    store = SessionStore(
        root, durability(backend), event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS
    )
    return lg.EventStoreSaver(store), store.close


def bench_graph(backend: str, root: Path, turns: int) -> dict[str, float]:
    rng = random.Random(7)
    replies = [text(rng, 1500) for _ in range(turns)]
    asks = [text(rng, 300) for _ in range(turns)]
    saver, close = lg_saver(backend, root)
    it = iter(replies)
    g = StateGraph(Chat)
    g.add_node("reply", lambda s: {"messages": [next(it)]})
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    graph = g.compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": "chat"}}
    t = time.perf_counter()
    for ask in asks:
        graph.invoke({"messages": [ask]}, cfg)
    elapsed = time.perf_counter() - t
    close()
    out = {"turns/s": turns / elapsed, "disk MB": disk_bytes(root) / 1e6}
    if backend != "sqlite":  # SqliteSaver has no prune
        saver2, close2 = lg_saver(backend, root)
        assert isinstance(saver2, lg.EventStoreSaver)
        saver2.prune(["chat"])
        close2()
        out["disk MB after prune"] = disk_bytes(root) / 1e6
    return out


def bench_put_get(
    backend: str,
    root: Path,
    n: int,
    make: Callable[[str, Path], tuple[BaseCheckpointSaver[Any], Callable[[], None]]] = lg_saver,
) -> dict[str, float]:
    """Puts, then cold and warm get, list and a cold get of an older checkpoint, each
    from a saver `make` opens anew (`bench.langgraph_postgres` passes its own)."""
    rng = random.Random(11)
    values = [text(rng, 1000) for _ in range(n)]
    saver, close = make(backend, root)
    t = time.perf_counter()
    configs = put_values(saver, "t", values)
    puts = n / (time.perf_counter() - t)
    close()
    saver, close = make(backend, root)
    latest: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    t = time.perf_counter()
    tup = saver.get_tuple(latest)
    cold = time.perf_counter() - t
    assert tup is not None and tup.checkpoint["channel_values"]["v"] == values[-1]
    t = time.perf_counter()
    saver.get_tuple(latest)
    warm = time.perf_counter() - t
    t = time.perf_counter()
    listed = sum(1 for _ in saver.list(latest))
    listing = time.perf_counter() - t
    assert listed == n
    close()
    saver, close = make(backend, root)
    t = time.perf_counter()
    tup = saver.get_tuple(configs[n // 2])
    cold_older = time.perf_counter() - t
    assert tup is not None and tup.checkpoint["channel_values"]["v"] == values[n // 2]
    close()
    return {
        "puts/s": puts,
        "cold get ms": cold * 1e3,
        "warm get ms": warm * 1e3,
        "list all ms": listing * 1e3,
        "cold get of an older checkpoint ms": cold_older * 1e3,
    }


# -- OpenAI Agents SDK -------------------------------------------------------------------


def agents_session(backend: str, root: Path, session_id: str) -> tuple[Any, Callable[[], Any]]:
    if backend == "sqlite":
        s = SQLiteSession(session_id, root / "agents.sqlite")
        return s, lambda: s.close()
    store = SessionStore(
        root, durability(backend), event_types=oa.EVENT_TYPES, projections=oa.PROJECTIONS
    )
    aio = AsyncSessionStore(store)
    es = oa.EventStoreSession(session_id, aio)

    async def close() -> None:
        await aio.close()
        store.close()

    return es, close


WARM_POPS = 100  # pops timed on a warm session object


async def bench_agents(backend: str, root: Path, turns: int) -> dict[str, float]:
    rng = random.Random(13)
    items = [
        [
            {"role": "user", "content": text(rng, 300)},
            {"role": "assistant", "content": text(rng, 1500)},
        ]
        for _ in range(turns)
    ]
    s, close = agents_session(backend, root, "chat")
    t = time.perf_counter()
    for pair in items:
        await s.add_items(pair)
    adds = turns / (time.perf_counter() - t)
    await _maybe_await(close())
    s, close = agents_session(backend, root, "chat")
    t = time.perf_counter()
    got = await s.get_items()
    cold = time.perf_counter() - t
    assert len(got) == 2 * turns
    t = time.perf_counter()
    await s.get_items()
    warm = time.perf_counter() - t
    t = time.perf_counter()
    await s.get_items(10)
    last10 = time.perf_counter() - t
    await _maybe_await(close())
    # a fresh session object on a fresh store (eventstore: nothing folded in memory)
    # for each of the two calls a new process makes first
    s, close = agents_session(backend, root, "chat")
    t = time.perf_counter()
    assert len(await s.get_items(20)) == min(20, 2 * turns)
    cold20 = time.perf_counter() - t
    await _maybe_await(close())
    s, close = agents_session(backend, root, "chat")
    t = time.perf_counter()
    assert await s.pop_item() is not None
    cold_pop = time.perf_counter() - t
    await s.get_items()  # (folded: the pops below judge the state this store holds)
    pops = min(WARM_POPS, 2 * turns - 1)
    t = time.perf_counter()
    for _ in range(pops):
        assert await s.pop_item() is not None
    warm_pop = (time.perf_counter() - t) / pops if pops else 0.0
    await s.clear_session()
    await _maybe_await(close())
    out = {
        "add_items/s": adds,
        "cold get_items ms": cold * 1e3,
        "warm get_items ms": warm * 1e3,
        "get_items(10) ms": last10 * 1e3,
        "cold get_items(20) ms": cold20 * 1e3,
        "cold pop_item ms": cold_pop * 1e3,
        "warm pop_item ms": warm_pop * 1e3,
        "disk MB": disk_bytes(root) / 1e6,
    }
    if backend != "sqlite":
        # the log keeps the cleared items (audit); compacting without an archive drops them
        store = SessionStore(root, event_types=oa.EVENT_TYPES, projections=oa.PROJECTIONS)
        store.compact("chat", archive=False)
        store.close()
    out["disk MB after clear (+ compact)"] = disk_bytes(root) / 1e6
    return out


async def _maybe_await(x: Any) -> None:
    if asyncio.iscoroutine(x):
        await x


# -- Google ADK ---------------------------------------------------------------------------

ADK_BACKENDS = ("sqlite", "database", "eventstore-fsync", "eventstore-flush")


def adk_service(backend: str, root: Path) -> Any:
    from google.adk.sessions.database_session_service import DatabaseSessionService
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    from eventstore.integrations import google_adk

    if backend == "sqlite":
        return SqliteSessionService(str(root / "adk.sqlite"))
    if backend == "database":
        return DatabaseSessionService(f"sqlite+aiosqlite:///{root / 'adk-db.sqlite'}")
    return google_adk.EventStoreSessionService(SessionStore(root, durability(backend)))


async def _close(service: Any) -> None:
    close = getattr(service, "close", None)
    if close is not None:
        await close()
    store = getattr(service, "store", None)
    if isinstance(store, SessionStore):
        store.close()


async def bench_adk(backend: str, root: Path, events: int) -> dict[str, float]:
    out = await adk_session_bench(lambda: adk_service(backend, root), events, _close)
    out["disk MB"] = disk_bytes(root) / 1e6
    return out


# -- Claude Agent SDK ---------------------------------------------------------------------

CLAUDE_BACKENDS = ("in-memory", "eventstore-fsync", "eventstore-flush")


def claude_store(backend: str, root: Path, memory: Any) -> Any:
    from eventstore.integrations import claude_agent_sdk

    if backend == "in-memory":
        return memory
    return claude_agent_sdk.EventStoreSessionStore(SessionStore(root, durability(backend)))


async def bench_claude(backend: str, root: Path, turns: int) -> dict[str, float]:
    from claude_agent_sdk import InMemorySessionStore

    rng = random.Random(19)
    key: Any = {"project_key": "bench", "session_id": "s"}
    batches = [
        [
            {"type": "user", "uuid": f"u{i}", "message": text(rng, 1000)},
            {"type": "assistant", "uuid": f"a{i}", "message": text(rng, 1000)},
        ]
        for i in range(turns)
    ]
    memory = InMemorySessionStore()
    store = claude_store(backend, root, memory)
    t = time.perf_counter()
    for batch in batches:
        await store.append(key, batch)
    appends = turns / (time.perf_counter() - t)
    if store is not memory:
        await store.close()
        store.store.close()
    store = claude_store(backend, root, memory)
    t = time.perf_counter()
    got = await store.load(key)
    load = time.perf_counter() - t
    assert got is not None and len(got) == 2 * turns
    if store is not memory:
        await store.close()
        store.store.close()
    return {"append/s": appends, "load ms": load * 1e3}


# -- the run -----------------------------------------------------------------------------

HIGHER_IS_BETTER = {"turns/s", "puts/s", "add_items/s", "append_event/s", "append/s"}


def measure(
    name: str,
    fn: Callable[[str, Path], dict[str, float]],
    repeat: int,
    backends: tuple[str, ...] = BACKENDS,
) -> dict[str, dict[str, float]]:
    medians: dict[str, dict[str, float]] = {}
    for backend in backends:
        runs: list[dict[str, float]] = []
        for r in range(repeat):
            root = Path(tempfile.mkdtemp(prefix="eventstore-bench-"))
            try:
                runs.append(fn(backend, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            print(f"{name} {backend} run {r + 1}/{repeat}", file=sys.stderr)
        medians[backend] = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    return medians


def interleaved(
    backends: tuple[str, ...], repeat: int, run: Callable[[str], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """`run(backend)` `repeat` times for each backend, the repeats interleaved (one run
    of each backend, then the next repeat); every run's figures by backend."""
    runs: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
    for r in range(repeat):
        for backend in backends:
            runs[backend].append(run(backend))
            print(f"{backend} run {r + 1}/{repeat}: {runs[backend][-1]}", file=sys.stderr)
    return runs


def report(title: str, runs: dict[str, list[dict[str, float]]]) -> str:
    """`table` of the runs' medians, then each backend's spreads (min-max)."""
    medians = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()}
    lines = [table(title, medians), "", "Spreads (min-max):", ""]
    for b, rs in runs.items():
        spans = (f"{k} {min(r[k] for r in rs):,.2f}-{max(r[k] for r in rs):,.2f}" for k in rs[0])
        lines.append(f"- {b}: " + "; ".join(spans))
    return "\n".join(lines)


def table(title: str, medians: dict[str, dict[str, float]]) -> str:
    """The medians per backend, and eventstore's ratios against the first backend (the
    framework's own) and the second when it is the framework's too."""
    backends = list(medians)
    theirs = [b for b in backends if not b.startswith("eventstore")]
    ours = [b for b in backends if b.startswith("eventstore")]
    metrics = list(dict.fromkeys(k for m in medians.values() for k in m))
    ratio_heads = [f"{o.removeprefix('eventstore-')} × {t}" for t in theirs for o in ours]
    lines = [f"### {title}", "", "| metric | " + " | ".join(backends + ratio_heads) + " |"]
    lines.append("|---" * (len(backends) + len(ratio_heads) + 1) + "|")
    for metric in metrics:
        cells = [f"{medians[b][metric]:,.2f}" if metric in medians[b] else "–" for b in backends]
        ratios = []
        for t in theirs:
            for o in ours:
                mine, base = medians[o].get(metric), medians[t].get(metric)
                if mine and base:
                    better = mine / base if metric in HIGHER_IS_BETTER else base / mine
                    ratios.append(f"{better:.2f}")
                else:
                    ratios.append("–")
        lines.append(f"| {metric} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=100, help="graph and session turns")
    parser.add_argument("--puts", type=int, default=1000, help="checkpoints in the put bench")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--adk-events", type=int, default=500, help="events in the ADK bench")
    parser.add_argument(
        "--only", choices=("langgraph", "agents", "adk", "claude"), help="one framework"
    )
    parser.add_argument("--json", type=Path, help="also write the medians as JSON")
    args = parser.parse_args(argv)
    wanted = {args.only} if args.only else {"langgraph", "agents", "adk", "claude"}
    results: dict[str, dict[str, dict[str, float]]] = {}
    if "langgraph" in wanted:
        results[f"LangGraph graph, {args.turns} turns"] = measure(
            "graph", lambda b, r: bench_graph(b, r, args.turns), args.repeat
        )
        results[f"LangGraph put / get, {args.puts} checkpoints"] = measure(
            "put/get", lambda b, r: bench_put_get(b, r, args.puts), args.repeat
        )
    if "agents" in wanted:
        results[f"Agents SDK session, {args.turns} turns"] = measure(
            "agents", lambda b, r: asyncio.run(bench_agents(b, r, args.turns)), args.repeat
        )
    if "adk" in wanted:
        results[f"ADK session service, {args.adk_events} events"] = measure(
            "adk",
            lambda b, r: asyncio.run(bench_adk(b, r, args.adk_events)),
            args.repeat,
            ADK_BACKENDS,
        )
    if "claude" in wanted:
        results[f"Claude Agent SDK store, {args.turns} turns"] = measure(
            "claude",
            lambda b, r: asyncio.run(bench_claude(b, r, args.turns)),
            args.repeat,
            CLAUDE_BACKENDS,
        )
    print(
        f"Medians of {args.repeat} runs, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}.\n"
    )
    for title, medians in results.items():
        print(table(title, medians) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
