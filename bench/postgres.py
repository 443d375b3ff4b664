"""`python -m bench --engine postgres`: eventstore's PostgreSQL engine beside the
`eventsourcing` library's PostgreSQL recorder, on the same server.

    python -m bench --engine postgres --url postgresql://postgres@127.0.0.1:5432/bench
    python -m bench --engine postgres --appends 2000 --writers 1,8 --repeat 3 --json pg.json

The URL defaults to $EVENTSTORE_BENCH_POSTGRES_URL, then $EVENTSTORE_TEST_POSTGRES_URL.
Every run works in fresh schemas it drops afterwards. The server must run with
`synchronous_commit=on` (the default; checked and printed): every acknowledged append
is on disk.

Measured (medians over repeats; the machine is shared and noisy):
- **appends/s** with 1 and 8 concurrent writer processes, each appending to a session of
  its own: eventstore through the session API (`append_progress_entry`) and eventsourcing
  (one aggregate per session, one `save` per event, its application recorder);
  the rate is all appends over the wall time from the common start to the last finish.
- **cold bootstrap load**: a fresh process (modules imported) opens the store and loads
  the bootstrap state of a session of `--load-events` progress entries; the same session
  on the file engine beside it.
- **follow latency**: a follower (its own store instance, LISTEN/NOTIFY wake-ups) sees
  each of `--follow-events` appends made at ~200/s; from before the append call to the
  follower holding the event.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from bench import server_url
from bench.follow import SUMMARY, follow_latency, percentile
from bench.places import drop_schema, with_schema

__all__ = ["main"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- writers (each in a process of its own) ---------------------------------------------


def _eventstore_writer(url: str, sid: str, n: int, gate: Any, out: Any) -> None:
    from eventstore import (
        ProgressEntry,
        SessionStore,
    )

    store = SessionStore(url)
    store.append_progress_entry(sid, ProgressEntry(run_id="warm", summary="warm"))
    gate.wait()
    t0, c0 = time.time(), time.process_time()
    for i in range(n):
        store.append_progress_entry(sid, ProgressEntry(run_id=f"r{i}", summary=SUMMARY))
    out.put((t0, time.time(), time.process_time() - c0))
    store.close()


def _plain_writer(url: str, schema: str, sid: str, n: int, gate: Any, out: Any) -> None:
    """The floor: one autocommit INSERT of one row (a line's bytes) per append."""
    import psycopg

    from eventstore.engines.postgres.url import split_url

    line = (
        b'{"seq":1,"ts":"2026-12-02T00:00:00.000000+00:00","type":"progress_appended",'
        + b'"entry":{"run_id":"r1","summary":"'
        + SUMMARY.encode()
        + b'"},"h":"0123456789abcdef"}\n'
    )
    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        insert = f'INSERT INTO "{schema}".plain (sid, seq, line) VALUES (%s, %s, %s)'
        conn.execute(insert, (sid, 0, line))
        gate.wait()
        t0, c0 = time.time(), time.process_time()
        for i in range(n):
            conn.execute(insert, (sid, i + 1, line))
        out.put((t0, time.time(), time.process_time() - c0))


def _server_counters(url: str) -> tuple[int, int, int]:
    """(committed transactions in the database, WAL records, WAL bytes) so far."""
    import psycopg

    from eventstore.engines.postgres.url import split_url

    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),"
            " (SELECT wal_records FROM pg_stat_wal),"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def _server_cpu(url: str) -> float:
    """CPU seconds the server's processes have used so far: the postmaster's own, its
    live children's (backends, WAL writer, checkpointer...) and those of the children
    it has reaped; NaN when the server is not on this machine or /proc does not show
    it. Robust where wall time is not: other work on a shared machine slows a run but
    hardly changes the CPU it takes."""
    import psycopg

    from eventstore.engines.postgres.url import split_url

    def fields(pid: int | str) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    try:
        with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
            me = conn.info.backend_pid
            postmaster = int(fields(me)[1])
        tick = os.sysconf("SC_CLK_TCK")
        total = sum(int(x) for x in fields(postmaster)[11:15])  # utime stime cutime cstime
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    f = fields(entry)
                except OSError:
                    continue  # ended meanwhile
                if int(f[1]) == postmaster:
                    total += int(f[11]) + int(f[12])
    except OSError:
        return float("nan")
    return total / tick


def _eventsourcing_env(url: str, schema: str) -> dict[str, str]:
    parts = urlsplit(url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": parts.path.lstrip("/"),
        "POSTGRES_HOST": parts.hostname or "127.0.0.1",
        "POSTGRES_PORT": str(parts.port or 5432),
        "POSTGRES_USER": unquote(parts.username or "postgres"),
        "POSTGRES_PASSWORD": unquote(parts.password or ""),
        "POSTGRES_SCHEMA": schema,
        "POSTGRES_POOL_SIZE": "2",
    }


def _eventsourcing_writer(url: str, schema: str, sid: str, n: int, gate: Any, out: Any) -> None:
    from bench.baselines.eventsourcing_backend import SessionAggregate, SessionsApp

    # the tables exist (made by _rate): concurrent CREATE ... IF NOT EXISTS can fail
    app = SessionsApp(env={**_eventsourcing_env(url, schema), "CREATE_TABLE": "no"})
    agg = SessionAggregate(
        session_id=sid,
        manifest=None,  # type: ignore[arg-type]  # the baseline's own session start
        features=[],
        progress=[],
        checkpoints=[],
    )
    app.save(agg)
    gate.wait()
    t0, c0 = time.time(), time.process_time()
    for i in range(n):
        agg.append_progress(
            {"run_id": f"r{i}", "summary": SUMMARY, "created_at": datetime.now(UTC).isoformat()}
        )
        app.save(agg)
    out.put((t0, time.time(), time.process_time() - c0))
    app.close()


def _rate(kind: str, url: str, writers: int, n: int) -> tuple[float, tuple[float, ...]]:
    """Appends per second of `writers` processes appending `n` each, started together,
    and per append: committed transactions, WAL records and WAL bytes (server counters
    read before and after; the counters flush when a backend goes idle or exits), the
    server's CPU microseconds (see `_server_cpu`; the writers' connecting and warm-up
    append included) and the writers' own CPU microseconds (their timed loops)."""
    ctx = mp.get_context("spawn")
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    gate = ctx.Barrier(writers + 1)
    out = ctx.Queue()
    procs = []
    if kind == "plain-insert":
        import psycopg

        from eventstore.engines.postgres.url import split_url

        with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(
                f'CREATE TABLE "{schema}".plain (sid text, seq bigint, line bytea NOT NULL,'
                " PRIMARY KEY (sid, seq))"
            )
    if kind == "eventsourcing":
        import psycopg

        from eventstore.engines.postgres.url import split_url

        with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        app_env = _eventsourcing_env(url, schema)
        # create the tables once, before the writers race to
        from bench.baselines.eventsourcing_backend import SessionsApp

        SessionsApp(env=app_env).close()
    if kind == "eventstore":
        from eventstore import SessionStore

        SessionStore(with_schema(url, schema)).close()  # the schema made before counting
    # counted from here: the writers' one warm-up append each is counted too
    before = _server_counters(url)
    cpu_before = _server_cpu(url)
    for w in range(writers):
        if kind == "eventstore":
            args: tuple[Any, ...] = (with_schema(url, schema), f"w{w}", n, gate, out)
            target: Any = _eventstore_writer
        elif kind == "plain-insert":
            args = (url, schema, f"w{w}", n, gate, out)
            target = _plain_writer
        else:
            args = (url, schema, f"w{w}", n, gate, out)
            target = _eventsourcing_writer
        p = ctx.Process(target=target, args=args)
        p.start()
        procs.append(p)
    try:
        gate.wait(timeout=300)
        spans = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(60)
        time.sleep(1.2)
        after = _server_counters(url)
        cpu_after = _server_cpu(url)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        drop_schema(url, schema)
    start = min(s for s, _, _ in spans)
    end = max(e for _, e, _ in spans)
    count = writers * n
    per = tuple((a - b) / count for a, b in zip(after, before, strict=True))
    cpu = ((cpu_after - cpu_before) * 1e6 / count, sum(c for _, _, c in spans) * 1e6 / count)
    return float(count / (end - start)), per + cpu


# -- cold load and follow latency --------------------------------------------------------


def _cold_load_child(url: str, sid: str, out: Any) -> None:
    # as in the main bench: modules imported (psycopg alone takes ~0.3-0.5 s to import),
    # nothing cached by the store; what is timed is opening the store and the first load
    t0 = time.perf_counter()
    from eventstore import SessionStore

    if url.startswith(("postgresql://", "postgres://")):
        # psycopg's import (0.1-0.5 s) is a module import, not the load
        import eventstore.engines.postgres.engine  # noqa: F401
    t1 = time.perf_counter()
    with SessionStore(url) as store:
        state = store.load_bootstrap_state(sid)
    t2 = time.perf_counter()
    out.put((t1 - t0, t2 - t1, len(state.recent_progress)))


def _cold_load(url: str, events: int, repeat: int) -> dict[str, Any]:
    """Cold loads of the same session from PostgreSQL and from the file engine."""
    import tempfile

    from eventstore import (
        ProgressEntry,
        SessionStore,
    )

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    surl = with_schema(url, schema)
    out_: dict[str, Any] = {"events": events}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, store_url in (("postgres", surl), ("file", f"{tmp}/store")):
                with SessionStore(store_url) as store:
                    for i in range(0, events, 100):
                        store.append(
                            "load",
                            [
                                _progress_event(ProgressEntry(run_id=f"r{j}", summary=SUMMARY))
                                for j in range(i, min(events, i + 100))
                            ],
                        )
                ctx = mp.get_context("spawn")
                times = []
                for _ in range(repeat):
                    q = ctx.Queue()
                    p = ctx.Process(target=_cold_load_child, args=(store_url, "load", q))
                    p.start()
                    _, load_s, got = q.get(timeout=300)
                    p.join(60)
                    assert got == events, (got, events)
                    times.append(load_s)
                out_[f"{name}_load_s"] = times
    finally:
        drop_schema(url, schema)
    return out_


def _progress_event(entry: Any) -> Any:
    from eventstore.format.events import ProgressAppended

    return ProgressAppended(entry=entry)


def _follow_latency(url: str, events: int) -> list[float]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        return follow_latency(with_schema(url, schema), events)
    finally:
        drop_schema(url, schema)


# -- report -------------------------------------------------------------------------------


def _server_facts(url: str) -> dict[str, str]:
    import psycopg

    from eventstore.engines.postgres.url import split_url

    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        facts = {
            k: str(conn.execute(f"SHOW {k}").fetchone()[0])  # type: ignore[index]
            for k in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
        }
    return facts


def postgres_url(ap: argparse.ArgumentParser, given: str | None) -> str:
    """The bench database (`bench.server_url`)."""
    return server_url(ap, given, "POSTGRES")


def main(argv: list[str] | None = None) -> int:
    """Run the PostgreSQL benchmark and print markdown tables."""
    ap = argparse.ArgumentParser(prog="python -m bench --engine postgres", description=__doc__)
    ap.add_argument("--engine", default="postgres", choices=["postgres"])
    ap.add_argument("--url", help="a database the bench may create schemas in")
    ap.add_argument("--appends", type=int, default=2000, help="appends per writer (default 2000)")
    ap.add_argument("--writers", default="1,8", help="writer counts (default 1,8)")
    ap.add_argument("--repeat", type=int, default=3, help="repeats (default 3)")
    ap.add_argument("--load-events", type=int, default=10_000)
    ap.add_argument("--follow-events", type=int, default=300)
    ap.add_argument("--json", help="also write the raw results to this file")
    a = ap.parse_args(argv)
    url = postgres_url(ap, a.url)
    from eventstore.engines.postgres.url import redact_url

    facts = _server_facts(url)
    _log(f"server: {redact_url(url)} {facts}")
    if facts["synchronous_commit"] != "on":
        _log("warning: synchronous_commit is not on: the figures do not compare")
    try:
        import eventsourcing  # noqa: F401

        kinds = ["eventstore", "plain-insert", "eventsourcing"]
    except ImportError:
        _log("eventsourcing is not installed (pip install -e '.[bench]'): no eventsourcing row")
        kinds = ["eventstore", "plain-insert"]
    writer_counts = [int(w) for w in a.writers.split(",")]
    rates: dict[str, dict[int, list[float]]] = {k: {w: [] for w in writer_counts} for k in kinds}
    per: dict[str, dict[int, list[tuple[float, ...]]]] = {
        k: {w: [] for w in writer_counts} for k in kinds
    }
    for _ in range(a.repeat):  # interleaved: each repeat runs every kind once
        for w in writer_counts:
            for kind in kinds:
                r, counts = _rate(kind, url, w, a.appends)
                rates[kind][w].append(r)
                per[kind][w].append(counts)
                _log(f"{kind} x{w}: {r:,.0f} appends/s; per append (xacts, WAL records,"
                     f" WAL bytes, server CPU us, client CPU us)"
                     f" {tuple(round(c, 2) for c in counts)}")  # fmt: skip
    cold = _cold_load(url, a.load_events, a.repeat)
    _log(f"cold load of {a.load_events} events: {cold}")
    follow = _follow_latency(url, a.follow_events)
    _log(f"follow: {len(follow)} latencies")

    lines = [
        f"Server: PostgreSQL {facts['server_version']}, synchronous_commit="
        f"{facts['synchronous_commit']}, fsync={facts['fsync']}"
        f" ({facts['wal_sync_method']}); {a.appends} appends per writer, medians of"
        f" {a.repeat} (min-max); × is against the plain one-row INSERT",
        "",
        "| writers | backend | appends/s | × | transactions / append | WAL records / append"
        " | WAL bytes / append | server CPU µs / append | client CPU µs / append |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in writer_counts:
        floor = statistics.median(rates["plain-insert"][w])
        for kind in kinds:
            rs = rates[kind][w]
            med = statistics.median(rs)
            cs = [statistics.median(c[i] for c in per[kind][w]) for i in range(5)]
            lines.append(
                f"| {w} | {kind} | {med:,.0f} ({min(rs):,.0f}-{max(rs):,.0f}) |"
                f" {med / floor:.2f} | {cs[0]:.2f} | {cs[1]:.2f} | {cs[2]:,.0f} |"
                f" {cs[3]:,.0f} | {cs[4]:,.0f} |"
            )
    lines += [
        "",
        f"Cold bootstrap load of a session of {a.load_events:,} progress entries (fresh"
        f" process, store opened and state loaded), medians: PostgreSQL"
        f" {statistics.median(cold['postgres_load_s']) * 1000:.0f} ms, the file engine"
        f" {statistics.median(cold['file_load_s']) * 1000:.0f} ms.",
        "",
        f"Follow latency (append call -> follower holds the event, {len(follow)} events):"
        f" median {statistics.median(follow) * 1000:.1f} ms,"
        f" p95 {percentile(follow, 0.95) * 1000:.1f} ms,"
        f" max {max(follow) * 1000:.1f} ms.",
    ]
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "server": facts,
                    "rates": rates,
                    "per_append": per,
                    "cold": cold,
                    "follow_s": follow,
                },
                f,
                indent=1,  # fmt: skip
            )
    return 0
