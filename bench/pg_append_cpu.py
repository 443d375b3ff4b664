"""`python -m bench.pg_append_cpu`: the server's CPU per call of the PostgreSQL engine's
`append` function, this code's schema against an older schema version's, beside a plain
one-row INSERT, on one connection.

    python -m bench.pg_append_cpu --url postgresql://postgres@127.0.0.1:5432/bench
    python -m bench.pg_append_cpu --against 4 --blocks 30 --calls 100 --sync off

The URL defaults to $EVENTSTORE_BENCH_POSTGRES_URL, then $EVENTSTORE_TEST_POSTGRES_URL;
the server must run on this machine (its backend's CPU time is read from /proc). Each
kind appends one-line batches to one session in a fresh schema (the functions called
directly, as the engine calls them), in blocks of `--calls` calls, the kinds' blocks
interleaved; the figure is the backend's CPU time (user + system) per call, summed over
the blocks, which other work on a shared machine hardly changes (wall time it does, ten
times over). `--sync off` sets `synchronous_commit=off` for the connection, so the
commits' disk waits leave the wall times too.

`--shapes` measures, instead of an older version, what a faster append could look like
(for the next schema version's design): this version's fast path sent as one client
statement instead of a function call; the function without the `sessions_updated`
index (so the head update can be HOT); and an append that only inserts its line,
its chain checked against the line before in the same statement (no head row).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.postgres import postgres_url

__all__ = ["main"]

LINE = b'{"seq":1,"ts":"2026-12-03T00:00:00.000000+00:00","type":"progress_appended","h":"0"}\n'


def _backend_cpu(pid: int) -> float:
    """CPU seconds the backend `pid` has used (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _appender(conn: Any, schema: str) -> Callable[[], None]:
    """One call of `schema`'s append function per call, each after the head it returned."""
    sql = f'SELECT * FROM "{schema}".append(%s, %s, %s, %s, %s, %s, %s, false, NULL, NULL)'
    head: list[Any] = [0, ""]

    def one() -> None:
        seq, link = head
        row = conn.execute(
            sql, ("s", seq, link, seq + 1, [LINE], f"h{seq}", f"l{seq}"), binary=True
        ).fetchone()
        assert row is not None and row[0] is False, row
        head[:] = [row[2], row[3]]

    return one


def _inserter(conn: Any, schema: str) -> Callable[[], None]:
    conn.execute(f'CREATE TABLE "{schema}".plain (sid text, seq bigint, line bytea NOT NULL,'
                 " PRIMARY KEY (sid, seq))")  # fmt: skip
    n = [0]

    def one() -> None:
        n[0] += 1
        conn.execute(f'INSERT INTO "{schema}".plain VALUES (%s, %s, %s)', ("s", n[0], LINE))

    return one


def _direct(conn: Any, schema: str) -> Callable[[], None]:
    """Version 5's fast path (the head update, the lines' insert, the listeners check)
    sent as one statement, the advisory lock taken in it; the session made first by the
    function."""
    from eventstore.engines.postgres.schema import SESSION_LOCK_SEED

    s = f'"{schema}"'
    sql = (
        f"WITH l AS (SELECT pg_advisory_xact_lock(hashtextextended(%(sid)s, {SESSION_LOCK_SEED})))"
        f", u AS (UPDATE {s}.sessions AS t SET head_seq = %(first)s, head_link = %(link)s,"
        f" head_h = %(h)s, stream_end = t.stream_end + octet_length(%(line)s::bytea),"
        f" updated_us = greatest(t.updated_us, %(ts)s) FROM l"
        f" WHERE t.session_id = %(sid)s AND t.head_seq = %(seq)s AND t.head_link = %(elink)s"
        f" RETURNING t.sid, t.log_id, t.base_seq, t.snap_len, t.live_origin, t.stream_end)"
        f", ins AS (INSERT INTO {s}.lines (sid, seq, stream_off, line)"
        f" SELECT u.sid, %(first)s, u.stream_end - octet_length(%(line)s::bytea), %(line)s FROM u)"
        f" SELECT u.log_id, u.base_seq, u.snap_len + u.stream_end - u.live_origin,"
        f" EXISTS (SELECT 1 FROM {s}.listeners) FROM u"
    )
    first = _appender(conn, schema)
    first()
    head: list[Any] = [1, "l0"]

    def one() -> None:
        seq, link = head
        row = conn.execute(
            sql,
            {"sid": "s", "first": seq + 1, "line": LINE, "link": f"l{seq}", "h": f"h{seq}",
             "ts": time.time_ns() // 1000, "seq": seq, "elink": link},
        ).fetchone()  # fmt: skip
        assert row is not None, head
        head[:] = [seq + 1, f"l{seq}"]

    return one


def _insert_only(conn: Any, schema: str) -> Callable[[], None]:
    """An append that inserts its line only, if the line before has the expected `h`
    (a primary key on (sid, seq): two appends at one seq cannot both land)."""
    s = f'"{schema}"'
    conn.execute(f"CREATE TABLE {s}.chained (sid bigint, seq bigint, h text NOT NULL,"
                 " line bytea NOT NULL, PRIMARY KEY (sid, seq))")  # fmt: skip
    conn.execute(f"INSERT INTO {s}.chained VALUES (1, 0, 'h0', '')")
    sql = (
        f"INSERT INTO {s}.chained (sid, seq, h, line) SELECT %s, %s, %s, %s"
        f" WHERE EXISTS (SELECT 1 FROM {s}.chained WHERE sid = %s AND seq = %s AND h = %s)"
        f" ON CONFLICT DO NOTHING RETURNING seq"
    )
    head: list[Any] = [0, "h0"]

    def one() -> None:
        seq, h = head
        row = conn.execute(sql, (1, seq + 1, f"h{seq + 1}", LINE, 1, seq, h)).fetchone()
        assert row is not None, head
        head[:] = [seq + 1, f"h{seq + 1}"]

    return one


def _kinds(
    conn: Any, shapes: bool, against: int
) -> tuple[list[str], dict[str, Callable[[], None]]]:
    """The schemas made and the kinds of append to measure in them."""
    import psycopg

    from eventstore.engines.postgres.schema import SCHEMA_VERSION, ddl

    schemas: list[str] = []

    def schema(version: int) -> str:
        schemas.append(f"bench_{uuid.uuid4().hex[:10]}")
        if not version:
            conn.execute(f'CREATE SCHEMA "{schemas[-1]}"')
        for v in range(1, version + 1):
            conn.execute(psycopg.sql.SQL(ddl(schemas[-1], v)))
        return schemas[-1]

    kinds: dict[str, Callable[[], None]] = {}
    if not shapes:
        kinds[f"schema v{against}"] = _appender(conn, schema(against))
    kinds[f"schema v{SCHEMA_VERSION}"] = _appender(conn, schema(SCHEMA_VERSION))
    if shapes:
        kinds["its fast path as one client statement"] = _direct(conn, schema(SCHEMA_VERSION))
        bare = schema(SCHEMA_VERSION)
        conn.execute(f'DROP INDEX "{bare}".sessions_updated')
        kinds["the function, no sessions_updated index"] = _appender(conn, bare)
        kinds["insert only, chain checked"] = _insert_only(conn, schema(0))
    kinds["plain INSERT"] = _inserter(conn, schema(0))
    return schemas, kinds


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print a markdown table."""
    import psycopg

    from eventstore.engines.postgres.schema import SCHEMA_VERSION
    from eventstore.engines.postgres.url import split_url

    ap = argparse.ArgumentParser(prog="python -m bench.pg_append_cpu", description=__doc__)
    ap.add_argument("--url", help="a database on this machine the bench may create schemas in")
    ap.add_argument("--against", type=int, default=SCHEMA_VERSION - 1, help="older version")
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--calls", type=int, default=100, help="calls per block")
    ap.add_argument("--sync", default="on", choices=["on", "off"])
    ap.add_argument("--shapes", action="store_true", help="faster shapes, not an older version")
    a = ap.parse_args(argv)
    url = postgres_url(ap, a.url)
    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        conn.execute(f"SET synchronous_commit = {a.sync}")
        pid = conn.info.backend_pid
        schemas: list[str] = []
        try:
            schemas, kinds = _kinds(conn, a.shapes, a.against)
            cpu: dict[str, float] = dict.fromkeys(kinds, 0.0)
            wall: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(a.blocks):
                for name, one in kinds.items():
                    c0, t0 = _backend_cpu(pid), time.perf_counter()
                    for _ in range(a.calls):
                        one()
                    wall[name].append((time.perf_counter() - t0) / a.calls)
                    cpu[name] += _backend_cpu(pid) - c0
        finally:
            for s in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
    total = a.blocks * a.calls
    print(
        f"{total} calls per kind in blocks of {a.calls}, interleaved; synchronous_commit={a.sync}"
    )
    print()
    print("| kind | server CPU µs / call | wall µs / call, median of blocks (min-max) |")
    print("|---|---:|---:|")
    for name in kinds:
        w = wall[name]
        print(
            f"| {name} | {cpu[name] / total * 1e6:,.0f} | {statistics.median(w) * 1e6:,.0f}"
            f" ({min(w) * 1e6:,.0f}-{max(w) * 1e6:,.0f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
