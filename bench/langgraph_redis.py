"""`python -m bench.langgraph_redis`: the LangGraph saver on the Redis engine, beside the
same saver on files and LangGraph's `SqliteSaver` (no Redis saver of LangGraph's runs
here: `langgraph-checkpoint-redis` needs the RedisJSON and RediSearch modules, which
Debian's `redis-server` lacks).

    python -m bench.langgraph_redis --url redis://127.0.0.1:6379/0 --puts 1000 --repeat 3

The URL: --url, $EVENTSTORE_BENCH_REDIS_URL, then $EVENTSTORE_TEST_REDIS_URL; each run
works under a fresh key prefix it deletes afterwards. The workload is
`bench.integrations.bench_put_get`'s (puts of a checkpoint chain, a cold `get_tuple`
from a new saver, a warm one, `list` of the whole thread, a cold `get_tuple` of the
checkpoint in the middle from another new saver). Repeats are interleaved. Durability
differs: `SqliteSaver` fsyncs every commit, eventstore's file and Redis rows are
"flush" (the Redis row as the server's `appendfsync` says).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.integrations import bench_put_get, interleaved, report
from bench.redis_trips import fresh_prefix, redis_url

__all__ = ["main"]

BACKENDS = ("sqlite", "eventstore-flush", "eventstore-redis")


def _run(url: str, backend: str, puts: int) -> dict[str, float]:
    from eventstore import SessionStore
    from eventstore.integrations import langgraph as lg

    root = Path(tempfile.mkdtemp(prefix="eventstore-bench-"))
    try:
        if backend != "eventstore-redis":
            return bench_put_get(backend, root, puts)
        with fresh_prefix(url, "lgbench") as prefixed:

            def make(_backend: str, _root: Path) -> tuple[Any, Any]:
                store = SessionStore(
                    prefixed, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS
                )
                return lg.EventStoreSaver(store), store.close

            return bench_put_get(backend, root, puts, make)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run the bench and print a markdown table (medians of interleaved repeats)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a Redis server the bench may write keys to")
    ap.add_argument("--puts", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    url = redis_url(ap, args.url)
    runs = interleaved(BACKENDS, args.repeat, lambda backend: _run(url, backend, args.puts))
    print(report(f"LangGraph on Redis, {args.puts} puts (medians of {args.repeat})", runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
