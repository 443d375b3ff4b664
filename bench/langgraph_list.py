"""LangGraph's full-index reads in a fresh process: `list(cfg, limit=10)` and `get_tuple`
of a checkpoint in the middle of the thread, eventstore against `SqliteSaver`, and
against the eventstore code of another checkout (`--base`) on the same logs.

    python -m bench.langgraph_list                          # 200 and 1,000 steps, 3 repeats
    python -m bench.langgraph_list --steps 200 --repeat 5 --base /tmp/wt-lglist-base

The workload is bench.langgraph_cold's ReAct loop (~400-character messages, about 12
checkpoints a turn, each holding the whole message list). Each repeat builds one thread
per backend (its store closed), then reads it in fresh processes with the modules
imported and the saver open before measuring: `list` reads every returned checkpoint's
`messages` (its values decoded, as `get_state_history` does), `get` one `get_tuple` of
the checkpoint halfway through the thread (eventstore: the full index, folded whole).
Per read: CPU and wall time, RSS kept (VmRSS after, the values still referenced, minus
before) and peak RSS growth (VmHWM, reset before the read, minus VmRSS before). The
readers of one repeat alternate their order. `--base DIR` reads the same eventstore logs
with the `eventstore` package of checkout DIR too (the code before a change: the log
format is the same).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fresh import run_module

READS = ("list", "get")
COLS = ("cpu ms", "wall ms", "kept MB", "peak MB")


def _status() -> dict[str, float]:
    """VmRSS and VmHWM of this process, in MB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def build(backend: str, root: Path, steps: int) -> dict[str, Any]:
    """The thread of bench.langgraph_cold (store closed), and its middle checkpoint id."""
    from bench.langgraph_cold import _saver
    from bench.langgraph_cold import build as build_thread

    figures = build_thread(backend, root, steps, close=True)
    saver, closer = _saver(backend, root)
    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(_cfg())]
    closer()
    return {**figures, "middle": ids[len(ids) // 2]}


def _cfg(checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": "react", "checkpoint_ns": ""}
    return {"configurable": {**conf, **({"checkpoint_id": checkpoint_id} if checkpoint_id else {})}}


def read(backend: str, root: Path, what: str, middle: str) -> dict[str, float]:
    """One read in this fresh process, measured."""
    import langgraph.checkpoint.base  # noqa: F401 - imported before measuring, as a server has

    from bench.langgraph_cold import _saver

    saver, closer = _saver(backend, root)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status()["VmRSS"]
    c, t = time.process_time(), time.perf_counter()
    if what == "list":
        got: Any = list(saver.list(_cfg(), limit=10))
        assert len(got) == 10 and all(x.checkpoint["channel_values"]["messages"] for x in got)
    else:
        got = saver.get_tuple(_cfg(middle))
        assert got is not None and got.checkpoint["channel_values"]["messages"]
    cpu, wall = time.process_time() - c, time.perf_counter() - t
    after = _status()
    figures = {
        "cpu ms": cpu * 1e3,
        "wall ms": wall * 1e3,
        "kept MB": after["VmRSS"] - before,
        "peak MB": after["VmHWM"] - before,
    }
    del got
    closer()
    return figures


def _child(*args: str, code: str | None = None) -> dict[str, Any]:
    # the other checkout's package first on the path: `-m` puts this one's directory
    # first, so the child inserts it itself (`--code`)
    extra = ["--code", code] if code else []
    return run_module("bench.langgraph_list", *extra, *args)


def one_run(steps: int, base: str | None, flip: bool) -> dict[tuple[str, str], dict[str, float]]:
    """Build a thread per backend and read it with each reader: {(reader, read): figures}."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="eventstore-lglist-"))
    try:
        readers: list[tuple[str, str, str | None]] = [
            ("sqlite", "sqlite", None),
            ("eventstore", "eventstore", None),
        ]
        if base:
            readers.append(("eventstore (base)", "eventstore", base))
        if flip:
            readers.reverse()
        built = {}
        for backend in ("sqlite", "eventstore"):
            (tmp / backend).mkdir()
            built[backend] = _child("build", backend, str(tmp / backend), str(steps))
        for what in READS:
            for name, backend, code in readers:
                args = ("read", backend, str(tmp / backend), what, built[backend]["middle"])
                out[(name, what)] = _child(*args, code=code)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--code"]:
        sys.path.insert(0, argv[1])
        argv = argv[2:]
    if argv[:1] == ["build"]:
        print(json.dumps(build(argv[1], Path(argv[2]), int(argv[3]))))
        return 0
    if argv[:1] == ["read"]:
        print(json.dumps(read(argv[1], Path(argv[2]), argv[3], argv[4])))
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", default="200,1000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", help="another checkout whose eventstore also reads the logs")
    args = parser.parse_args(argv)
    runs: dict[tuple[int, str, str], list[dict[str, float]]] = {}
    for r in range(args.repeat):
        for steps in map(int, args.steps.split(",")):
            for (name, what), figures in one_run(steps, args.base, flip=r % 2 == 1).items():
                runs.setdefault((steps, what, name), []).append(figures)
            print(f"repeat {r + 1}: {steps} steps", file=sys.stderr)
    print(_table(runs))
    return 0


def _table(runs: dict[tuple[int, str, str], list[dict[str, float]]]) -> str:
    """Medians (min-max) per (steps, read, reader), and the median of per-repeat ratios
    of CPU and kept RSS against SqliteSaver's in the same repeat."""
    lines = [
        "| steps | read | reader | " + " | ".join(COLS) + " | × SQLite cpu | × SQLite kept |",
        "|---:|---|---|" + "---:|" * (len(COLS) + 2),
    ]
    for (steps, what, name), figs in sorted(runs.items()):
        sqlite = runs[(steps, what, "sqlite")]
        cells = []
        for c in COLS:
            vals = sorted(f[c] for f in figs)
            cells.append(f"{statistics.median(vals):,.1f} ({vals[0]:,.1f}-{vals[-1]:,.1f})")
        ratios = []
        for c in ("cpu ms", "kept MB"):
            per = sorted(f[c] / max(b[c], 0.1) for f, b in zip(figs, sqlite, strict=True))
            ratios.append(f"{statistics.median(per):.2f} ({per[0]:.2f}-{per[-1]:.2f})")
        lines.append(f"| {steps:,} | {what} | {name} | {' | '.join(cells + ratios)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
