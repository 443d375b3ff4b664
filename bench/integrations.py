"""Integrations bench: eventstore's adapters against each framework's own backend, on
every engine: LangGraph's savers, the Agents SDK's sessions, ADK's session services and
the Claude Agent SDK's store.

    pip install -e '.[bench]'
    python -m bench.integrations                    # files, ~2-4 min; markdown to stdout
    python -m bench.integrations --turns 50 --repeat 3 --json out.json
    python -m bench.integrations --engine postgres --url postgresql://postgres@127.0.0.1:5432/bench
    python -m bench.integrations --engine redis --url redis://127.0.0.1:6379/0 --only agents

Each framework runs on eventstore and on its own backend on the same engine, in the same
run, repeats interleaved (one run of each backend, then the next repeat: a noisy
neighbour hits all alike), every run in a fresh directory, schema or key prefix
(`bench.places`); medians, then each backend's spread (min-max).

Backends (`BACKENDS`; the framework's own first, the ratios' reference):
- **files** (`--engine file`, the default): `SqliteSaver`, `SQLiteSession`, ADK's
  `SqliteSessionService` and `DatabaseSessionService` (`sqlite+aiosqlite`), all on a
  file with SQLite's defaults (WAL, `synchronous=FULL`: every commit fsynced), against
  eventstore with `durability="fsync"` (the same class: survives power loss) and
  `"flush"` (the default: survives a killed process).
- **PostgreSQL** (`--engine postgres`): `PostgresSaver`, the Agents SDK's
  `SQLAlchemySession` and ADK's `DatabaseSessionService` (both `postgresql+psycopg`),
  in the same database and schema as eventstore's engine; every commit waits for the
  server's `synchronous_commit`, on both sides.
- **Redis** (`--engine redis`): the Agents SDK's `RedisSession` and ADK's
  `RedisSessionService` on the same server and key prefix as eventstore's engine (both
  acknowledged by the server, as its `appendfsync` says); LangGraph against `SqliteSaver`
  (`langgraph-checkpoint-redis` needs the RedisJSON and RediSearch modules, which
  Debian's `redis-server` lacks).
- The Claude Agent SDK has only its `InMemorySessionStore` (no durability at all: a
  floor, not a rival), on every engine.

Workloads (seeded, identical for every backend):
- **LangGraph graph turns**: a one-node chat graph (`messages` is an appended list
  channel), one `invoke` per turn with a ~300-character user message and a
  ~1,500-character reply; sync API, one thread.
- **LangGraph put / get**: `put` of a checkpoint chain (one ~1 kB channel value per
  checkpoint), then `get_tuple` of the newest checkpoint from a new saver instance
  (cold) and again (warm), and `list` of the whole thread (eventstore: the first read
  of the full index in that saver); then, from another new saver, `get_tuple` of the
  checkpoint in the middle of the chain (cold, named by id).
- **Agents SDK session**: `add_items` of a user and an assistant item per turn, then
  `get_items()` from a new session object (cold), again (warm), and `get_items(10)`;
  `get_items(20)` and `pop_item()`, each the first call of a new session object on a
  new store (cold: what a fresh process pays, modules imported); on that object, after a
  whole `get_items()`, 100 more `pop_item()` (warm: the time of one, averaged; the disk
  figures include them); then `clear_session()` (eventstore: and
  `compact(archive=False)`), and the disk again (files only).
- **ADK session service**: `append_event` of a ~300-character event (with a session
  state delta) to one session, `--adk-events` of them (500), then
  `get_session(num_recent_events=20)` from a new service (cold) and again (warm), and
  the whole session.
- **Claude Agent SDK store**: `append` of one batch of two ~1 kB entries per turn, then
  `load` (from a new store object for eventstore: cold).

Ratios: eventstore's against each of the framework's backends; above 1 eventstore is
better.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from agents.memory import SQLiteSession
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from bench import server_url
from bench.adk_workload import adk_session_bench, text
from bench.places import ENGINES, Place, place
from bench.workload import put_values
from eventstore import SessionStore
from eventstore.aio import AsyncSessionStore
from eventstore.integrations import langgraph as lg
from eventstore.integrations import openai_agents as oa

# each framework's backends on each engine: the framework's own first (the ratios'
# reference), then eventstore's
BACKENDS: dict[str, dict[str, tuple[str, ...]]] = {
    "langgraph": {
        "file": ("sqlite", "eventstore-fsync", "eventstore-flush"),
        "postgres": ("postgres-saver", "eventstore"),
        "redis": ("sqlite", "eventstore"),
    },
    "agents": {
        "file": ("sqlite", "eventstore-fsync", "eventstore-flush"),
        "postgres": ("sqlalchemy", "eventstore"),
        "redis": ("redis-session", "eventstore"),
    },
    "adk": {
        "file": ("sqlite", "database", "eventstore-fsync", "eventstore-flush"),
        "postgres": ("database", "eventstore"),
        "redis": ("redis-service", "eventstore"),
    },
    "claude": {
        "file": ("in-memory", "eventstore-fsync", "eventstore-flush"),
        "postgres": ("in-memory", "eventstore"),
        "redis": ("in-memory", "eventstore"),
    },
}


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def es_store(backend: str, p: Place, **options: Any) -> SessionStore:
    """eventstore's store of a run (`eventstore-fsync`: `durability="fsync"`)."""
    durability: Any = "fsync" if backend == "eventstore-fsync" else "flush"
    return SessionStore(p.store, durability, **options)


def sqlalchemy_engine_args(p: Place) -> tuple[str, dict[str, Any]]:
    """The SQLAlchemy async URL of the run's PostgreSQL database (psycopg 3) and the
    engine's arguments that put its tables in the run's schema."""
    from eventstore.engines.postgres.url import split_url

    assert p.server is not None
    conninfo = split_url(p.server)[0]
    url = "postgresql+psycopg://" + conninfo.split("://", 1)[1]
    return url, {"connect_args": {"options": f"-c search_path={p.ns}"}}


async def maybe_await(x: Any) -> None:
    if asyncio.iscoroutine(x):
        await x


# -- LangGraph ---------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def lg_saver(backend: str, p: Place) -> tuple[BaseCheckpointSaver[Any], Callable[[], None]]:
    """A new saver of `backend` on the run's place, and what closes it."""
    if backend == "sqlite":
        conn = sqlite3.connect(p.dir / "checkpoints.sqlite", check_same_thread=False)
        return SqliteSaver(conn), conn.close
    if backend == "postgres-saver":
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        from eventstore.engines.postgres.url import split_url

        assert p.server is not None
        pg = psycopg.connect(
            split_url(p.server)[0],
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={p.ns}",
        )
        saver = PostgresSaver(pg)
        saver.setup()
        return saver, pg.close
    store = es_store(backend, p, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS)
    return lg.EventStoreSaver(store), store.close


def bench_graph(backend: str, p: Place, turns: int) -> dict[str, float]:
    rng = random.Random(7)
    replies = [text(rng, 1500) for _ in range(turns)]
    asks = [text(rng, 300) for _ in range(turns)]
    saver, close = lg_saver(backend, p)
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
    out = {"turns/s": turns / elapsed}
    if p.engine == "file":
        out["disk MB"] = disk_bytes(p.dir) / 1e6
    if backend.startswith("eventstore"):  # the framework's savers have no prune
        saver2, close2 = lg_saver(backend, p)
        assert isinstance(saver2, lg.EventStoreSaver)
        saver2.prune(["chat"])
        close2()
        if p.engine == "file":
            out["disk MB after prune"] = disk_bytes(p.dir) / 1e6
    return out


def bench_put_get(backend: str, p: Place, n: int) -> dict[str, float]:
    """Puts, then cold and warm get, list and a cold get of an older checkpoint, each
    from a saver opened anew."""
    rng = random.Random(11)
    values = [text(rng, 1000) for _ in range(n)]
    saver, close = lg_saver(backend, p)
    t = time.perf_counter()
    configs = put_values(saver, "t", values)
    puts = n / (time.perf_counter() - t)
    close()
    saver, close = lg_saver(backend, p)
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
    saver, close = lg_saver(backend, p)
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


def agents_session(backend: str, p: Place, session_id: str) -> tuple[Any, Callable[[], Any]]:
    """A new session object of `backend` on the run's place, and what closes it."""
    if backend == "sqlite":
        s = SQLiteSession(session_id, p.dir / "agents.sqlite")
        return s, s.close
    if backend == "sqlalchemy":
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        url, engine_kwargs = sqlalchemy_engine_args(p)
        alchemy = SQLAlchemySession.from_url(
            session_id, url=url, engine_kwargs=engine_kwargs, create_tables=True
        )
        return alchemy, alchemy.engine.dispose
    if backend == "redis-session":
        from agents.extensions.memory.redis_session import RedisSession

        assert p.server is not None
        redis_session = RedisSession.from_url(
            session_id, url=p.server.split("?")[0], key_prefix=f"{p.ns}:agents"
        )
        return redis_session, redis_session.close
    store = es_store(backend, p, event_types=oa.EVENT_TYPES, projections=oa.PROJECTIONS)
    aio = AsyncSessionStore(store)
    es = oa.EventStoreSession(session_id, aio)

    async def close() -> None:
        await aio.close()
        store.close()

    return es, close


WARM_POPS = 100  # pops timed on a warm session object


async def bench_agents(backend: str, p: Place, turns: int) -> dict[str, float]:
    rng = random.Random(13)
    items = [
        [
            {"role": "user", "content": text(rng, 300)},
            {"role": "assistant", "content": text(rng, 1500)},
        ]
        for _ in range(turns)
    ]
    s, close = agents_session(backend, p, "chat")
    t = time.perf_counter()
    for pair in items:
        await s.add_items(pair)
    adds = turns / (time.perf_counter() - t)
    await maybe_await(close())
    s, close = agents_session(backend, p, "chat")
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
    await maybe_await(close())
    # a fresh session object on a fresh store (eventstore: nothing folded in memory)
    # for each of the two calls a new process makes first
    s, close = agents_session(backend, p, "chat")
    t = time.perf_counter()
    assert len(await s.get_items(20)) == min(20, 2 * turns)
    cold20 = time.perf_counter() - t
    await maybe_await(close())
    s, close = agents_session(backend, p, "chat")
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
    await maybe_await(close())
    out = {
        "add_items/s": adds,
        "cold get_items ms": cold * 1e3,
        "warm get_items ms": warm * 1e3,
        "get_items(10) ms": last10 * 1e3,
        "cold get_items(20) ms": cold20 * 1e3,
        "cold pop_item ms": cold_pop * 1e3,
        "warm pop_item ms": warm_pop * 1e3,
    }
    if p.engine == "file":
        out["disk MB"] = disk_bytes(p.dir) / 1e6
        if backend.startswith("eventstore"):
            # the log keeps the cleared items (audit); compacting without an archive drops them
            store = es_store(backend, p, event_types=oa.EVENT_TYPES, projections=oa.PROJECTIONS)
            store.compact("chat", archive=False)
            store.close()
        out["disk MB after clear (+ compact)"] = disk_bytes(p.dir) / 1e6
    return out


# -- Google ADK ---------------------------------------------------------------------------


def adk_service(backend: str, p: Place) -> tuple[Any, Callable[[], Any]]:
    """A new session service of `backend` on the run's place, and what closes it."""
    from google.adk.sessions.database_session_service import DatabaseSessionService
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    from eventstore.integrations import google_adk

    if backend == "sqlite":
        return SqliteSessionService(str(p.dir / "adk.sqlite")), lambda: None
    if backend == "database":
        if p.engine == "postgres":
            url, engine_kwargs = sqlalchemy_engine_args(p)
            db = DatabaseSessionService(url, **engine_kwargs)
        else:
            db = DatabaseSessionService(f"sqlite+aiosqlite:///{p.dir / 'adk-db.sqlite'}")
        return db, db.close
    if backend == "redis-service":
        import redis.asyncio as aredis
        from google.adk.integrations.redis import RedisSessionService, RedisSessionServiceConfig

        assert p.server is not None
        client = aredis.from_url(p.server.split("?")[0], decode_responses=True)
        config = RedisSessionServiceConfig(key_prefix=f"{p.ns}:adk:")
        return RedisSessionService(config, redis_client=client), client.aclose
    store = es_store(backend, p)
    service = google_adk.EventStoreSessionService(store)

    async def close() -> None:
        await service.close()
        store.close()

    return service, close


async def bench_adk(backend: str, p: Place, events: int) -> dict[str, float]:
    closers: dict[int, Callable[[], Any]] = {}

    def make() -> Any:
        service, close = adk_service(backend, p)
        closers[id(service)] = close
        return service

    async def close(service: Any) -> None:
        await maybe_await(closers.pop(id(service))())

    out = await adk_session_bench(make, events, close)
    if p.engine == "file":
        out["disk MB"] = disk_bytes(p.dir) / 1e6
    return out


# -- Claude Agent SDK ---------------------------------------------------------------------


def claude_store(backend: str, p: Place, memory: Any) -> Any:
    from eventstore.integrations import claude_agent_sdk

    if backend == "in-memory":
        return memory
    return claude_agent_sdk.EventStoreSessionStore(es_store(backend, p))


async def bench_claude(backend: str, p: Place, turns: int) -> dict[str, float]:
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
    store = claude_store(backend, p, memory)
    t = time.perf_counter()
    for batch in batches:
        await store.append(key, batch)
    appends = turns / (time.perf_counter() - t)
    if store is not memory:
        await store.close()
        store.store.close()
    store = claude_store(backend, p, memory)
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


def run(
    framework: str, engine: str, url: str | None, repeat: int, fn: Callable[[str, Place], Any]
) -> dict[str, list[dict[str, float]]]:
    """`fn(backend, place)` of every backend of `framework` on `engine`, each run in a
    fresh place, the repeats interleaved (a coroutine `fn` is run to its end)."""

    def one(backend: str) -> dict[str, float]:
        with place(engine, url) as p:
            out = fn(backend, p)
            return asyncio.run(out) if asyncio.iscoroutine(out) else out  # type: ignore[no-any-return]

    return interleaved(BACKENDS[framework][engine], repeat, one)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=ENGINES, default="file", help="where both sides store")
    parser.add_argument("--url", help="the PostgreSQL database or Redis server (--engine)")
    parser.add_argument("--turns", type=int, default=100, help="graph and session turns")
    parser.add_argument("--puts", type=int, default=1000, help="checkpoints in the put bench")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--adk-events", type=int, default=500, help="events in the ADK bench")
    parser.add_argument("--only", choices=tuple(BACKENDS), help="one framework")
    parser.add_argument("--json", type=Path, help="also write every run as JSON")
    args = parser.parse_args(argv)
    engine = args.engine
    url = None if engine == "file" else server_url(parser, args.url, engine.upper())
    parts: dict[str, tuple[str, Callable[[str, Place], Any]]] = {
        f"LangGraph graph, {args.turns} turns": (
            "langgraph",
            lambda b, p: bench_graph(b, p, args.turns),
        ),
        f"LangGraph put / get, {args.puts} checkpoints": (
            "langgraph",
            lambda b, p: bench_put_get(b, p, args.puts),
        ),
        f"Agents SDK session, {args.turns} turns": (
            "agents",
            lambda b, p: bench_agents(b, p, args.turns),
        ),
        f"ADK session service, {args.adk_events} events": (
            "adk",
            lambda b, p: bench_adk(b, p, args.adk_events),
        ),
        f"Claude Agent SDK store, {args.turns} turns": (
            "claude",
            lambda b, p: bench_claude(b, p, args.turns),
        ),
    }
    results = {
        f"{title} ({engine})": run(framework, engine, url, args.repeat, fn)
        for title, (framework, fn) in parts.items()
        if args.only in (None, framework)
    }
    print(
        f"Medians of {args.repeat} interleaved runs on {engine}, {os.cpu_count()} CPUs,"
        f" Python {sys.version.split()[0]}.\n"
    )
    for title, runs in results.items():
        print(report(title, runs) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
