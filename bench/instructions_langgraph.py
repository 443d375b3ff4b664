"""Instructions of LangGraph's checkpointer on files, counted by valgrind's callgrind: an
A/B of `EventStoreSaver` (and against `SqliteSaver`) that a shared machine's noise
cannot move (see `bench.instructions` for what callgrind counts and what it does not).

    python -m bench.instructions_langgraph get STORE [--backend eventstore|sqlite]
    python -m bench.instructions_langgraph puts [--backend ...] [--turns 4]
    python -m bench.instructions_langgraph list STORE [--thread react] [--limit N] [--warm]
    python -m bench.instructions_langgraph ... --src CHECKOUT   # another checkout's code

`get`: one cold `get_tuple` of the newest checkpoint of thread "react" in a fresh
process, as `bench.langgraph_cold` times it (its modules imported and its saver opened
first), on a store `python -m bench.langgraph_cold build BACKEND STORE STEPS 0|1` built
(copied for the run: a killed writer's store is read as killed each time).

`list`: one `list` of thread THREAD (every checkpoint, or the newest LIMIT) in a fresh
process on (a copy of) STORE, every tuple built, after a `get_tuple` of its newest
(as `bench.integrations` lists after its gets: the store open, its modules imported);
`--warm`: after a first `list` too, so the full index is folded and only the tuples'
building is counted.

`puts`: the saver's `put` in `bench.langgraph_cold`'s ReAct graph (12 a turn), at
`durability="fsync"` for eventstore, over the puts of TURNS turns after a first (the
graph's own work not counted).

Only the instructions executed inside the call measured are counted: it runs through
`sys.call_tracing` (which changes nothing when no tracer is set) and callgrind collects
within that C function alone (`--toggle-collect`), so the process's start-up and the
rest of its work do not move the count.

Runs with `PYTHONHASHSEED=0` and the session index's lag out of the way.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_PRELUDE = """
import sys
sys.path.insert(0, {src!r})
import eventstore.engines.file.index_lag as _lag
_lag.INDEX_LAG = 1e9
from pathlib import Path
import langgraph.checkpoint.base
from bench import langgraph_cold as lc
"""

_GET = (
    _PRELUDE
    + """
saver, closer = lc._saver({backend!r}, Path({root!r}))
cfg = {{"configurable": {{"thread_id": "react", "checkpoint_ns": ""}}}}
assert sys.call_tracing(saver.get_tuple, (cfg,)) is not None
import os
os._exit(0)  # (closing is not the get's cost)
"""
)

_LIST = (
    _PRELUDE
    + """
saver, closer = lc._saver({backend!r}, Path({root!r}))
cfg = {{"configurable": {{"thread_id": {thread!r}, "checkpoint_ns": ""}}}}
assert saver.get_tuple(cfg) is not None
if {warm!r}:
    list(saver.list(cfg, limit={limit!r}))
got = sys.call_tracing(lambda: list(saver.list(cfg, limit={limit!r})), ())
assert got
import os
os._exit(0)
"""
)

_PUTS = (
    _PRELUDE
    + """
import random
from langchain_core.messages import HumanMessage
from bench.adk_workload import text as words
if {backend!r} == "sqlite":
    saver, closer = lc._saver("sqlite", Path({root!r}))
else:
    from eventstore import SessionStore
    from eventstore.integrations import langgraph as lg
    store = SessionStore(Path({root!r}), "fsync", event_types=lg.EVENT_TYPES,
                         projections=lg.PROJECTIONS)
    saver = lg.EventStoreSaver(store)
rng = random.Random(5)
graph = lc._graph(saver, lambda n: words(rng, n))
cfg = {{"configurable": {{"thread_id": "react"}}}}
graph.invoke({{"messages": [HumanMessage(content=words(rng, 400))]}}, cfg)
put = saver.put
saver.put = lambda *a: sys.call_tracing(put, a)
for _ in range({turns}):
    graph.invoke({{"messages": [HumanMessage(content=words(rng, 400))]}}, cfg)
import os
os._exit(0)
"""
)


def count(code: str) -> int:
    """Instructions callgrind counts for `python -c code`."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
        + ["--collect-atstart=no", "--toggle-collect=*call_tracing*"]
        + [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"the run failed or callgrind printed no count:\n{out.stderr}")
    return int(found.group(1))


def cold_get(src: Path, backend: str, store: Path) -> int:
    """Instructions of one cold `get_tuple` on (a copy of) `store`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(store, root)
        return count(_GET.format(src=str(src), backend=backend, root=str(root)))


def listing(
    src: Path, backend: str, store: Path, thread: str, limit: int | None, warm: bool
) -> int:
    """Instructions of one `list` of `thread` on (a copy of) `store` (`warm`: the second)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(store, root)
        code = _LIST.format(
            src=str(src), backend=backend, root=str(root), thread=thread, limit=limit, warm=warm
        )
        return count(code)


def per_put(src: Path, backend: str, turns: int) -> float:
    """Instructions of one put (LangGraph's step included) over `turns` turns."""
    with tempfile.TemporaryDirectory() as tmp:
        code = _PUTS.format(src=str(src), backend=backend, root=tmp, turns=turns)
        return count(code) / (12 * turns)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.instructions_langgraph")
    ap.add_argument("what", choices=["get", "puts", "list"])
    ap.add_argument("store", type=Path, nargs="?")
    ap.add_argument("--backend", default="eventstore", choices=["eventstore", "sqlite"])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--thread", default="react", help="list: the thread listed")
    ap.add_argument("--limit", type=int, help="list: its limit (default: every checkpoint)")
    ap.add_argument("--warm", action="store_true", help="list: the second, index folded")
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1])
    a = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (e.g. apt-get install valgrind)", file=sys.stderr)
        return 2
    if a.what in ("get", "list") and a.store is None:
        ap.error(f"{a.what} needs the STORE a `bench.langgraph_cold build` made")
    if a.what == "list":
        got = listing(a.src.resolve(), a.backend, a.store, a.thread, a.limit, a.warm)
        print(f"{a.backend} {'warm ' if a.warm else ''}list: {got:,}")
    elif a.what == "get":
        assert a.store is not None
        print(f"{a.backend} cold get_tuple: {cold_get(a.src.resolve(), a.backend, a.store):,}")
    else:
        print(f"{a.backend} put: {per_put(a.src.resolve(), a.backend, a.turns):,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
