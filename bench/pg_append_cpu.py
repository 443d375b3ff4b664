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


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print a markdown table."""
    import psycopg

    from eventstore.engines.postgres.schema import SCHEMA_VERSION, ddl
    from eventstore.engines.postgres.url import split_url

    ap = argparse.ArgumentParser(prog="python -m bench.pg_append_cpu", description=__doc__)
    ap.add_argument("--url", help="a database on this machine the bench may create schemas in")
    ap.add_argument("--against", type=int, default=SCHEMA_VERSION - 1, help="older version")
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--calls", type=int, default=100, help="calls per block")
    ap.add_argument("--sync", default="on", choices=["on", "off"])
    a = ap.parse_args(argv)
    url = postgres_url(ap, a.url)
    versions = {f"schema v{a.against}": a.against, f"schema v{SCHEMA_VERSION}": SCHEMA_VERSION}
    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        conn.execute(f"SET synchronous_commit = {a.sync}")
        pid = conn.info.backend_pid
        schemas: list[str] = []
        kinds: dict[str, Callable[[], None]] = {}
        try:
            for name, version in versions.items():
                schemas.append(f"bench_{uuid.uuid4().hex[:10]}")
                for v in range(1, version + 1):
                    conn.execute(psycopg.sql.SQL(ddl(schemas[-1], v)))  # type: ignore[arg-type]
                kinds[name] = _appender(conn, schemas[-1])
            schemas.append(f"bench_{uuid.uuid4().hex[:10]}")
            conn.execute(f'CREATE SCHEMA "{schemas[-1]}"')
            kinds["plain INSERT"] = _inserter(conn, schemas[-1])
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
