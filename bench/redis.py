"""`python -m bench --engine redis`: eventstore's Redis engine interleaved with the file
engine on the same machine (the file engine is the reference every figure is a ratio of).

    python -m bench --engine redis --url redis://127.0.0.1:6379/0
    python -m bench --engine redis --appends 500 --writers 1,8 --repeat 3 --json redis.json

The URL defaults to $EVENTSTORE_BENCH_REDIS_URL, then $EVENTSTORE_TEST_REDIS_URL. Every run
writes under fresh key prefixes it deletes afterwards. The server's `appendonly` and
`appendfsync` are printed: with `appendfsync always` the Redis rows also run
`durability="fsync"` beside the file engine's fsync.

Measured, every repeat running each engine in turn (so a noisy neighbour hits all alike),
medians and spreads (max/min) over repeats:
- **appends/s** with 1 and 8 concurrent writer processes, each appending progress entries
  (~150 bytes) to a session of its own; all appends over the wall time from the common
  start to the last finish.
- **cold bootstrap load** and **cold transcript load** of a 2,000-turn session (two
  messages of ~300 and ~1,500 characters per turn, a progress entry every 5th turn): a
  fresh process opens the store and loads.
- **follow latency**: a follower sees each of `--follow-events` appends made at ~200/s.

The frameworks on Redis (ADK's `RedisSessionService`, the Agents SDK's `RedisSession`
against eventstore's adapters on a `redis://` store): `python -m bench.integrations
--engine redis`.

Not measured: `langgraph-checkpoint-redis` (`RedisSaver`) needs the RedisJSON and
RediSearch 2.x modules; Debian 12 ships no RedisJSON package and RediSearch only as 1.2
(`redis-redisearch`), which has no JSON indexes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.follow import SUMMARY, follow_latency, percentile
from bench.places import drop_keys, with_prefix

__all__ = ["main"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _writer(url: str, durability: str, sid: str, n: int, gate: Any, out: Any) -> None:
    from eventstore import ProgressEntry, SessionStore

    store = SessionStore(url, durability=durability)  # type: ignore[arg-type]
    store.append_progress_entry(sid, ProgressEntry(run_id="warm", summary="warm"))
    gate.wait()
    t0 = time.time()
    for i in range(n):
        store.append_progress_entry(sid, ProgressEntry(run_id=f"r{i}", summary=SUMMARY))
    out.put((t0, time.time()))
    store.close()


def _rate(url: str, durability: str, writers: int, n: int) -> float:
    """Appends per second of `writers` processes appending `n` each, started together."""
    ctx = mp.get_context("spawn")
    gate = ctx.Barrier(writers + 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(url, durability, f"w{w}", n, gate, out))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    try:
        gate.wait(timeout=300)
        spans = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return float(writers * n / (max(e for _, e in spans) - min(s for s, _ in spans)))


def _fill(url: str, turns: int) -> None:
    """A session of `turns` turns, as bench.workload's shape: two messages per turn, a
    progress entry every 5th."""
    from eventstore import Message, ProgressEntry, Role, SessionStore

    with SessionStore(url) as store:
        for t in range(turns):
            store.append_transcript_messages(
                "load",
                [Message(Role.USER, f"q{t} " + "u" * 300), Message(Role.ASSISTANT, "a" * 1500)],
            )
            if t % 5 == 0:
                store.append_progress_entry("load", ProgressEntry(run_id=f"r{t}", summary=SUMMARY))


def _cold_child(url: str, what: str, out: Any) -> None:
    from eventstore import SessionStore

    if url.startswith("redis"):
        import redis  # noqa: F401  (imported, as the main bench imports its modules)
    t0 = time.perf_counter()
    with SessionStore(url) as store:
        if what == "bootstrap":
            n = len(store.load_bootstrap_state("load").recent_progress)
        else:
            n = len(store.load_transcript_messages("load"))
    out.put((time.perf_counter() - t0, n))


def _cold(url: str, what: str) -> float:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_cold_child, args=(url, what, q))
    p.start()
    secs, n = q.get(timeout=300)
    p.join(60)
    assert n > 0
    return float(secs)


def _server_facts(url: str) -> dict[str, str]:
    import redis

    client = redis.Redis.from_url(url.split("?")[0])
    info = client.info()
    facts = {
        "redis_version": str(info.get("redis_version")),
        "appendonly": "yes" if int(info.get("aof_enabled", 0)) else "no",
        "appendfsync": str(client.config_get("appendfsync").get("appendfsync")),
    }
    client.close()
    return facts


def _spread(xs: list[float]) -> str:
    return f"{max(xs) / min(xs):.2f}" if xs and min(xs) > 0 else "-"


def main(argv: list[str] | None = None) -> int:
    """Run the Redis benchmark and print markdown tables."""
    ap = argparse.ArgumentParser(prog="python -m bench --engine redis", description=__doc__)
    ap.add_argument("--engine", default="redis", choices=["redis"])
    ap.add_argument("--url", help="a Redis server the bench may write keys to")
    ap.add_argument("--appends", type=int, default=500, help="appends per writer (default 500)")
    ap.add_argument("--writers", default="1,8", help="writer counts (default 1,8)")
    ap.add_argument("--repeat", type=int, default=3, help="repeats (default 3)")
    ap.add_argument("--turns", type=int, default=2000, help="turns of the loaded session")
    ap.add_argument("--follow-events", type=int, default=300)
    ap.add_argument("--json", help="also write the raw results to this file")
    a = ap.parse_args(argv)
    url = (
        a.url
        or os.environ.get("EVENTSTORE_BENCH_REDIS_URL")
        or os.environ.get("EVENTSTORE_TEST_REDIS_URL")
    )
    if not url:
        ap.error("give --url (or set EVENTSTORE_BENCH_REDIS_URL)")
    facts = _server_facts(url)
    _log(f"server: {facts}")
    prefixes: list[str] = []

    def redis_store() -> str:
        prefixes.append(f"bench{uuid.uuid4().hex[:10]}")
        return with_prefix(url, prefixes[-1])

    lines: list[str] = []
    raw: dict[str, Any] = {"server": facts}
    try:
        lines += _engine_part(a, facts, redis_store, raw)
    finally:
        for p in prefixes:
            drop_keys(url, p)
    print(
        f"Server: Redis {facts['redis_version']}, appendonly={facts['appendonly']},"
        f" appendfsync={facts['appendfsync']}; {os.cpu_count()} CPUs\n"
    )
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f)
    return 0


def _engine_part(
    a: argparse.Namespace,
    facts: dict[str, str],
    redis_store: Callable[[], str],
    raw: dict[str, Any],
) -> list[str]:
    """Appends, cold loads and follow latency, Redis against the file engine."""
    tmp = tempfile.TemporaryDirectory()

    def file_store() -> str:
        return f"{tmp.name}/{uuid.uuid4().hex}"

    engines: dict[str, tuple[Callable[[], str], str]] = {
        "file flush": (file_store, "flush"),
        "redis flush": (redis_store, "flush"),
        "file fsync": (file_store, "fsync"),
    }
    if facts["appendonly"] == "yes" and facts["appendfsync"] == "always":
        engines["redis fsync"] = (redis_store, "fsync")
    writer_counts = [int(w) for w in a.writers.split(",")]
    rates: dict[str, dict[int, list[float]]] = {e: {w: [] for w in writer_counts} for e in engines}
    cold: dict[str, dict[str, list[float]]] = {
        e: {"bootstrap": [], "transcript": []} for e in ("file", "redis")
    }
    try:
        loaded = {"file": file_store(), "redis": redis_store()}
        for u in loaded.values():
            _fill(u, a.turns)
        for r in range(a.repeat):
            for w in writer_counts:
                for name, (make, durability) in engines.items():
                    rate = _rate(make(), durability, w, a.appends)
                    rates[name][w].append(rate)
                    _log(f"[{r + 1}] {name} x{w}: {rate:,.0f} appends/s")
            for eng, u in loaded.items():
                for what in ("bootstrap", "transcript"):
                    cold[eng][what].append(_cold(u, what))
            _log(f"[{r + 1}] cold: {cold}")
        follow = {"redis": follow_latency(redis_store(), a.follow_events)}
        follow["file"] = follow_latency(file_store(), a.follow_events)
    finally:
        tmp.cleanup()
    raw.update(rates=rates, cold=cold, follow_s=follow)
    return _report(a, facts, writer_counts, rates, cold, follow)


def _report(
    a: argparse.Namespace,
    facts: dict[str, str],
    writer_counts: list[int],
    rates: dict[str, dict[int, list[float]]],
    cold: dict[str, dict[str, list[float]]],
    follow: dict[str, list[float]],
) -> list[str]:
    lines = [
        f"Server: Redis {facts['redis_version']}, appendonly={facts['appendonly']},"
        f" appendfsync={facts['appendfsync']}; {a.appends} appends per writer, medians of"
        f" {a.repeat} (spread: max/min)",
        "",
        "| engine | writers | appends/s | spread | × file (same durability) |",
        "|---|---:|---:|---:|---:|",
    ]
    for w in writer_counts:
        for name, xs in rates.items():
            ref = rates[f"file {name.split()[1]}"][w]
            ratio = statistics.median(xs[w]) / statistics.median(ref)
            lines.append(
                f"| {name} | {w} | {statistics.median(xs[w]):,.0f} | {_spread(xs[w])}"
                f" | {ratio:.2f} |"
            )
    lines += [
        "",
        f"Cold loads of a {a.turns:,}-turn session (fresh process: store opened, one load):",
        "",
        "| engine | bootstrap ms | spread | transcript ms | spread |",
        "|---|---:|---:|---:|---:|",
    ]
    for eng, d in cold.items():
        lines.append(
            f"| {eng} | {statistics.median(d['bootstrap']) * 1000:.0f} | {_spread(d['bootstrap'])}"
            f" | {statistics.median(d['transcript']) * 1000:.0f} | {_spread(d['transcript'])} |"
        )
    lines.append("")
    for eng, xs in follow.items():
        if xs:
            lines.append(
                f"Follow latency, {eng} ({len(xs)} events): median"
                f" {statistics.median(xs) * 1000:.1f} ms, p95 {percentile(xs, 0.95) * 1000:.1f} ms."
            )
    return lines
