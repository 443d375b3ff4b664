"""Cold LangGraph reads on PostgreSQL, many per run: eventstore's saver and LangGraph's
`PostgresSaver` on the same server, each read from a saver opened anew (a new pool,
so a new server session: each statement is planned for the first time there).

    python bench/langgraph_pg_cold.py --url postgresql://postgres@127.0.0.1:5432/bench
    python bench/langgraph_pg_cold.py --reads 20 --json cold.json

The thread is `bench.integrations.bench_put_get`'s (`--puts` checkpoints of one
channel, a 1,000-character value each); then `--reads` rounds, each a cold
`get_tuple` of the newest checkpoint, a cold `get_tuple` of the one in the middle and
a cold `list` of the whole thread, each from a new saver, the backends alternating.
Run as a file (not `-m`), it imports `bench` and `eventstore` from `PYTHONPATH`:
the same script measures another checkout's code (an A/B).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.integrations import lg_saver, text
from bench.places import place
from bench.postgres import postgres_url
from bench.workload import put_values

__all__ = ["main"]

BACKENDS = ("postgres-saver", "eventstore")


def _cold(backend: str, p: Any, read: Callable[[Any], object]) -> float:
    """ms of `read(saver)` on a saver opened anew (its opening not counted)."""
    saver, close = lg_saver(backend, p)
    try:
        t = time.perf_counter()
        read(saver)
        return (time.perf_counter() - t) * 1e3
    finally:
        close()


def run(url: str, puts: int, reads: int) -> dict[str, dict[str, list[float]]]:
    """Every read's ms, by backend and read."""
    rng = random.Random(11)
    values = [text(rng, 1000) for _ in range(puts)]
    out: dict[str, dict[str, list[float]]] = {}
    with place("postgres", url) as p:
        configs = {}
        for backend in BACKENDS:
            saver, close = lg_saver(backend, p)
            configs[backend] = put_values(saver, "t", values)
            close()
        latest: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        for _ in range(reads):
            for backend in BACKENDS:
                older = configs[backend][puts // 2]
                got = out.setdefault(backend, {})

                def check_latest(saver: Any) -> None:
                    tup = saver.get_tuple(latest)
                    assert tup.checkpoint["channel_values"]["v"] == values[-1]

                def check_older(saver: Any, older: Any = older) -> None:
                    tup = saver.get_tuple(older)
                    assert tup.checkpoint["channel_values"]["v"] == values[puts // 2]

                def check_list(saver: Any) -> None:
                    assert sum(1 for _ in saver.list(latest)) == puts

                for name, read in (
                    ("cold get ms", check_latest),
                    ("cold get of an older checkpoint ms", check_older),
                    ("list all ms", check_list),
                ):
                    got.setdefault(name, []).append(_cold(backend, p, read))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run, print each read's median (min-max) per backend."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a database the bench may create schemas in")
    ap.add_argument("--puts", type=int, default=1000)
    ap.add_argument("--reads", type=int, default=10)
    ap.add_argument("--json", type=Path, help="also write every read's ms as JSON")
    a = ap.parse_args(argv)
    out = run(postgres_url(ap, a.url), a.puts, a.reads)
    for backend, reads in out.items():
        for name, xs in reads.items():
            print(
                f"{backend:15s} {name:36s} {statistics.median(xs):7.2f}"
                f" ({min(xs):.2f}-{max(xs):.2f})"
            )
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
