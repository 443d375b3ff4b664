"""LangGraph on PostgreSQL: eventstore's saver on the PostgreSQL engine against
LangGraph's own `PostgresSaver` (langgraph-checkpoint-postgres), on the same server.

    pip install -e '.[bench]'
    python -m bench.langgraph_postgres --url postgresql://postgres@127.0.0.1:5432/bench
    python -m bench.langgraph_postgres --puts 1000 --repeat 5 --json lgpg.json

The URL defaults to $EVENTSTORE_BENCH_POSTGRES_URL, then $EVENTSTORE_TEST_POSTGRES_URL.
The workload is `bench.integrations.bench_put_get`'s (puts of a checkpoint chain, then
a cold `get_tuple` from a new saver, a warm one, `list` of the whole thread, and a cold
`get_tuple` of the checkpoint in the middle from another new saver), as
`python -m bench.integrations --engine postgres --only langgraph` runs it, plus the
server's transactions per put. Each run works in a fresh schema it drops afterwards
(`bench.places`); both savers commit every put with the server's `synchronous_commit`
(the same durability). Repeats are interleaved (one run of each backend, then the next
repeat).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.integrations import bench_put_get, interleaved, lg_saver, report
from bench.places import place
from bench.postgres import _server_counters, postgres_url

__all__ = ["main"]

BACKENDS = ("postgres-saver", "eventstore")


def _run(url: str, backend: str, puts: int) -> dict[str, float]:
    with place("postgres", url) as p:
        lg_saver(backend, p)[1]()  # the tables made before anything is counted
        before = _server_counters(url)
        out = bench_put_get(backend, p, puts)
        time.sleep(1.0)  # the closed connections' counters reach the server's totals
        after = _server_counters(url)
    # every transaction of the run over the puts (the reads' own are few: read-only
    # statements in autocommit are counted too, as the server counts them)
    out["server transactions per put"] = (after[0] - before[0]) / puts
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the bench and print a markdown table (medians of interleaved repeats)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a database the bench may create schemas in")
    ap.add_argument("--puts", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write every run as JSON")
    a = ap.parse_args(argv)
    url = postgres_url(ap, a.url)
    runs = interleaved(BACKENDS, a.repeat, lambda backend: _run(url, backend, a.puts))
    print(f"Medians of {a.repeat} interleaved runs, {a.puts} checkpoints.\n")
    print(report(f"LangGraph put / get on PostgreSQL, {a.puts} checkpoints", runs))
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
