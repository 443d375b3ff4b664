"""LangGraph's cold `get_tuple` on files: the first read of a fresh process, as a graph's
`invoke` starts, after the writer was killed, after it closed, and after the store was
copied; against `SqliteSaver` in the same run.

    python -m bench.langgraph_cold                       # 50, 200, 1,000 steps, 3 repeats
    python -m bench.langgraph_cold --steps 50,200 --repeat 5

The workload: a ReAct-style loop (an agent node that calls a tool five times a turn,
then answers; a tool node; `messages` an `add_messages` channel of ~400-character
messages), so about 12 checkpoints per turn, each holding the whole message list.
Every (backend, steps, repeat) builds its thread in a process of its own; each cold read
runs in another fresh process with the modules already imported, and reports the CPU
time and wall time of one `get_tuple` of the newest checkpoint. Scenarios (eventstore):

- `killed`: the writer ended with `os._exit` after its last put (never closed: what a
  crashed or still running writer leaves);
- `closed`: the writer closed its store;
- `copied`: the closed store copied elsewhere (`shutil.copytree`: new inodes).

`SqliteSaver` is read after its connection closed. Puts/s is the graph loop's
checkpoints per second (LangGraph's own work included, the same on both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from bench.fresh import run_module

SCENARIOS = {
    "sqlite": ("closed",),
    "eventstore": ("killed", "closed", "copied"),
}
TOOL_ROUNDS = 5


def _saver(backend: str, root: Path) -> tuple[Any, Any]:
    if backend == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(root / "checkpoints.sqlite", check_same_thread=False)
        return SqliteSaver(conn), conn.close
    from eventstore import SessionStore
    from eventstore.integrations import langgraph as lg

    store = SessionStore(root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS)
    return lg.EventStoreSaver(store), store.close


class State(TypedDict):
    messages: Annotated[list[Any], add_messages]


def _graph(saver: Any, text: Any) -> Any:
    def agent(s: State) -> dict[str, Any]:
        calls = 0  # tool calls since the user's message
        for m in reversed(s["messages"]):
            if isinstance(m, HumanMessage):
                break
            calls += isinstance(m, ToolMessage)
        if calls < TOOL_ROUNDS:
            call = {"name": "search", "args": {"q": text(80)}, "id": f"c{len(s['messages'])}"}
            return {"messages": [AIMessage(content=text(400), tool_calls=[call])]}
        return {"messages": [AIMessage(content=text(400))]}

    def tools(s: State) -> dict[str, Any]:
        call = s["messages"][-1].tool_calls[0]
        return {"messages": [ToolMessage(content=text(400), tool_call_id=call["id"])]}

    def route(s: State) -> str:
        return "tools" if s["messages"][-1].tool_calls else END

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tools", tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def build(backend: str, root: Path, steps: int, close: bool) -> dict[str, float]:
    """Run turns until the thread holds at least `steps` checkpoints."""
    import random

    from bench.adk_workload import text as words

    rng = random.Random(5)
    saver, closer = _saver(backend, root)
    graph = _graph(saver, lambda n: words(rng, n))
    cfg: Any = {"configurable": {"thread_id": "react"}}
    per_turn = 2 * TOOL_ROUNDS + 2
    t = time.perf_counter()
    for _ in range(max(1, steps // per_turn)):
        graph.invoke({"messages": [HumanMessage(content=words(rng, 400))]}, cfg)
    elapsed = time.perf_counter() - t
    done = sum(1 for _ in saver.list(cfg))
    out = {"puts/s": done / elapsed, "checkpoints": float(done)}
    if not close:
        print(json.dumps(out), flush=True)
        os._exit(0)  # killed: nothing saved at close
    closer()
    return out


def cold_get(backend: str, root: Path) -> dict[str, float]:
    """One `get_tuple` of the newest checkpoint, the first read of this process."""
    import langgraph.checkpoint.base  # noqa: F401 - imported before timing, as a server has

    saver, closer = _saver(backend, root)
    cfg: Any = {"configurable": {"thread_id": "react", "checkpoint_ns": ""}}
    c, t = time.process_time(), time.perf_counter()
    tup = saver.get_tuple(cfg)
    cpu, wall = time.process_time() - c, time.perf_counter() - t
    assert tup is not None and tup.checkpoint["channel_values"]["messages"]
    closer()
    return {"cold get cpu ms": cpu * 1e3, "cold get wall ms": wall * 1e3}


def _child(*args: str) -> dict[str, float]:
    return run_module("bench.langgraph_cold", *args)


def _disk(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def one_run(backend: str, steps: int) -> dict[str, dict[str, float]]:
    """Build and read cold, per scenario of `backend`: {scenario: figures}."""
    out: dict[str, dict[str, float]] = {}
    base = Path(tempfile.mkdtemp(prefix="eventstore-lgcold-"))
    try:
        for scenario in SCENARIOS[backend]:
            root = base / scenario
            if scenario == "copied":
                shutil.copytree(base / "closed", root)
                built = dict(out["closed"])
            else:
                root.mkdir()
                close = "1" if scenario == "closed" else "0"
                built = _child("build", backend, str(root), str(steps), close)
            built["disk MB"] = _disk(root)
            out[scenario] = {**built, **_child("get", backend, str(root))}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "build":
        print(json.dumps(build(argv[1], Path(argv[2]), int(argv[3]), argv[4] == "1")))
        return 0
    if argv and argv[0] == "get":
        print(json.dumps(cold_get(argv[1], Path(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="50,200,1000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    runs: dict[tuple[int, str, str], list[dict[str, float]]] = {}
    for r in range(args.repeat):
        for steps in map(int, args.steps.split(",")):
            for backend in SCENARIOS:  # interleaved: every backend within each repeat
                for scenario, figures in one_run(backend, steps).items():
                    runs.setdefault((steps, backend, scenario), []).append(figures)
                print(f"repeat {r + 1}: {steps} steps {backend}", file=sys.stderr)
    print(_table(runs))
    return 0


def _table(runs: dict[tuple[int, str, str], list[dict[str, float]]]) -> str:
    cols = ["checkpoints", "puts/s", "disk MB", "cold get cpu ms", "cold get wall ms"]
    lines = [
        "| steps | backend | scenario | " + " | ".join(cols) + " | × SQLite cpu (spread) |",
        "|---:|---|---|" + "---:|" * (len(cols) + 1),
    ]
    for (steps, backend, scenario), figs in runs.items():
        med = {c: statistics.median(f[c] for f in figs) for c in cols}
        base = runs[(steps, "sqlite", "closed")]
        ratios = sorted(
            b["cold get cpu ms"] / f["cold get cpu ms"] for f, b in zip(figs, base, strict=True)
        )
        spread = f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        cells = " | ".join(f"{med[c]:,.2f}" for c in cols)
        lines.append(f"| {steps:,} | {backend} | {scenario} | {cells} | {spread} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
