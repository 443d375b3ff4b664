"""EventStoreSaver under a real LangGraph graph, and what it promises beyond the
conformance suite: one append per saver call, forks that never share a blob, pruning
that removes bytes, a clean `eventstore verify`, and resumes from a new saver instance.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import math
import multiprocessing
import operator
import os
import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from conftest import checkpoint_summary, cli_in_process, same_value
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from eventstore import (
    CorruptLogError,
    InvalidArgumentError,
    InvalidSessionIdError,
    SessionDeletedError,
    SessionStore,
    entropy,
)
from eventstore.cli.app import main as cli_main
from eventstore.engines.file.layout import SessionPaths
from eventstore.integrations import langgraph as lg
from eventstore.integrations.langgraph import EventStoreSaver


class Doc(TypedDict):
    log: Annotated[list[str], operator.add]


def draft(state: Doc) -> dict[str, Any]:
    return {"log": ["drafted"]}


def review(state: Doc) -> dict[str, Any]:
    answer = interrupt({"question": "publish?", "log": state["log"]})
    return {"log": [f"review:{answer}"]}


def publish(state: Doc) -> dict[str, Any]:
    return {"log": ["published"]}


def build(saver: EventStoreSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    g = StateGraph(Doc)
    g.add_node("draft", draft)
    g.add_node("review", review)
    g.add_node("publish", publish)
    g.add_edge(START, "draft")
    g.add_edge("draft", "review")
    g.add_edge("review", "publish")
    g.add_edge("publish", END)
    return g.compile(checkpointer=saver)


def plain_store(root: Path) -> SessionStore:
    return SessionStore(root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS)


def test_interrupt_resume_from_a_new_saver_history_and_forks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg: Any = {"configurable": {"thread_id": "t1"}}
    with EventStoreSaver(tmp_path) as saver:
        first = build(saver).invoke({"log": ["start"]}, cfg)
        assert first["log"] == ["start", "drafted"]
        assert first["__interrupt__"][0].value["question"] == "publish?"
        assert build(saver).get_state(cfg).next == ("review",)

    # a new process would open a new saver on the same store: the interrupt is there
    with EventStoreSaver(tmp_path) as saver:
        graph = build(saver)
        paused = graph.get_state(cfg)
        assert paused.next == ("review",)
        assert paused.interrupts[0].value["log"] == ["start", "drafted"]
        done = graph.invoke(Command(resume="yes"), cfg)
        assert done["log"] == ["start", "drafted", "review:yes", "published"]

        history = list(graph.get_state_history(cfg))
        ids = [s.config["configurable"]["checkpoint_id"] for s in history]
        assert ids == sorted(ids, reverse=True)  # newest first
        assert [s.metadata["step"] for s in history] == [3, 2, 1, 0, -1]  # type: ignore[index]
        assert history[0].values["log"] == done["log"]
        for newer, older in zip(history, history[1:], strict=False):
            assert newer.parent_config is not None
            assert (
                newer.parent_config["configurable"]["checkpoint_id"]
                == (older.config["configurable"]["checkpoint_id"])
            )

        # fork at the pause: edit the state there and run the other branch
        at_pause = next(s for s in history if s.next == ("review",))
        fork_cfg = graph.update_state(at_pause.config, {"log": ["edited"]})
        forked = graph.invoke(Command(resume="no"), fork_cfg)
        assert forked["log"] == ["start", "drafted", "edited", "review:no", "published"]
        # both branches keep their own values (channel versions never collide)
        assert graph.get_state(history[0].config).values["log"] == done["log"]
        assert graph.get_state(cfg).values["log"] == forked["log"]
        assert len(list(graph.get_state_history(cfg))) == len(history) + 3

    sid = "langgraph-t1"
    assert plain_store(tmp_path).verify(sid).ok
    assert cli_main(["verify", str(tmp_path), sid]) == 0
    assert "ok" in capsys.readouterr().out


def test_async_graph_resumes_from_a_new_saver(tmp_path: Path) -> None:
    cfg: Any = {"configurable": {"thread_id": "async"}}

    async def main() -> tuple[list[str], int]:
        async with EventStoreSaver(tmp_path) as saver:
            await build(saver).ainvoke({"log": ["a"]}, cfg)
        async with EventStoreSaver(tmp_path) as saver:
            graph = build(saver)
            assert (await graph.aget_state(cfg)).next == ("review",)
            out = await graph.ainvoke(Command(resume="ok"), cfg)
            history = [s async for s in graph.aget_state_history(cfg)]
            return out["log"], len(history)

    log, steps = asyncio.run(main())
    assert log == ["a", "drafted", "review:ok", "published"]
    assert steps == 5
    assert plain_store(tmp_path).verify("langgraph-async").ok


def test_many_threads_run_concurrently_on_one_store(tmp_path: Path) -> None:
    async def main() -> list[list[str]]:
        async with EventStoreSaver(tmp_path) as saver:
            graph = build(saver)
            cfgs: list[Any] = [{"configurable": {"thread_id": f"t{i}"}} for i in range(12)]
            await asyncio.gather(
                *(graph.ainvoke({"log": [c["configurable"]["thread_id"]]}, c) for c in cfgs)
            )
            outs = await asyncio.gather(*(graph.ainvoke(Command(resume="y"), c) for c in cfgs))
            return [o["log"] for o in outs]

    logs = asyncio.run(main())
    assert logs == [[f"t{i}", "drafted", "review:y", "published"] for i in range(12)]
    store = plain_store(tmp_path)
    assert sorted(store.list_sessions()) == sorted(f"langgraph-t{i}" for i in range(12))
    assert all(store.verify(s).ok for s in store.list_sessions())


def _graph_worker(root: str, worker: int, go: Any) -> None:
    go.wait()
    with EventStoreSaver(root) as saver:
        graph = build(saver)
        cfg: Any = {"configurable": {"thread_id": f"proc{worker}"}}
        graph.invoke({"log": [f"w{worker}"]}, cfg)
        graph.invoke(Command(resume=str(worker)), cfg)
        parent = None
        for i in range(10):  # and checkpoints into one thread every process writes
            parent = put(saver, "common", parent, v=f"{worker}:{i}")


def test_several_processes_on_one_store(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_graph_worker, args=(str(tmp_path), w, go)) for w in range(3)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with EventStoreSaver(tmp_path) as saver:
        graph = build(saver)
        for w in range(3):
            cfg: Any = {"configurable": {"thread_id": f"proc{w}"}}
            assert graph.get_state(cfg).values["log"] == [
                f"w{w}",
                "drafted",
                f"review:{w}",
                "published",
            ]
        common = list(saver.list({"configurable": {"thread_id": "common"}}))
        assert sorted(t.checkpoint["channel_values"]["v"] for t in common) == sorted(
            f"{w}:{i}" for w in range(3) for i in range(10)
        )
    store = plain_store(tmp_path)
    assert all(store.verify(s).ok for s in store.list_sessions())


def test_compaction_keeps_every_checkpoint_and_the_graph_resumes(tmp_path: Path) -> None:
    cfg: Any = {"configurable": {"thread_id": "c"}}
    store = plain_store(tmp_path)
    saver = EventStoreSaver(store)
    graph = build(saver)
    graph.invoke({"log": ["x"]}, cfg)
    before = [(s.config, s.values, s.next) for s in graph.get_state_history(cfg)]
    report = store.compact("langgraph-c", force=True)
    assert report.events_before > 1
    fresh = build(EventStoreSaver(plain_store(tmp_path)))
    assert [(s.config, s.values, s.next) for s in fresh.get_state_history(cfg)] == before
    assert fresh.invoke(Command(resume="z"), cfg)["log"] == [
        "x",
        "drafted",
        "review:z",
        "published",
    ]
    assert plain_store(tmp_path).verify("langgraph-c").ok


def put(
    saver: EventStoreSaver, thread: str, parent: Any = None, run_id: str = "", **values: Any
) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    versions: dict[str, str | int | float] = {k: saver.get_next_version(None, None) for k in values}
    cp["channel_values"] = dict(values)
    cp["channel_versions"] = versions
    cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent is not None:
        cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    metadata: Any = {"source": "loop", "step": 0, "run_id": run_id or thread}
    return saver.put(cfg, cp, metadata, versions)


def test_every_saver_call_is_one_atomic_append(tmp_path: Path) -> None:
    store = plain_store(tmp_path)
    saver = EventStoreSaver(store)
    c1 = put(saver, "a", v=1)
    assert store.last_seq("langgraph-a") == 1
    saver.put_writes(c1, [("x", 1), ("y", 2), ("z", 3)], "task")
    assert store.last_seq("langgraph-a") == 2
    put(saver, "a", c1, v=2)
    saver.copy_thread("a", "b")
    assert store.last_seq("langgraph-b") == 1
    saver.delete_for_runs(["a"])
    assert store.last_seq("langgraph-a") == 4
    assert store.last_seq("langgraph-b") == 2  # the copy kept the run ids: one removal
    assert [type(e).__name__ for e in store.read_events("langgraph-a")] == [
        "CheckpointPut",
        "WritesPut",
        "CheckpointPut",
        "CheckpointsRemoved",
    ]


def test_put_writes_from_many_threads_are_all_kept(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    c1 = put(saver, "w", v=1)

    def write(i: int) -> None:
        saver.put_writes(c1, [(f"ch{i}", i)], f"task{i}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tup = saver.get_tuple(c1)
    assert isinstance(tup, CheckpointTuple)
    assert sorted(tup.pending_writes or []) == sorted((f"task{i}", f"ch{i}", i) for i in range(16))


def test_a_fork_never_reads_another_branchs_blob(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    root = put(saver, "f", v="root")
    # two children of one parent, each writing channel v once: same counter, new suffix
    left = put(saver, "f", root, v="left")
    right = put(saver, "f", root, v="right")
    for cfg, want in ((root, "root"), (left, "left"), (right, "right")):
        tup = saver.get_tuple(cfg)
        assert tup is not None and tup.checkpoint["channel_values"] == {"v": want}


def test_versions_increase_and_are_unique() -> None:
    saver = EventStoreSaver.__new__(EventStoreSaver)
    v1 = saver.get_next_version(None, None)
    v2 = saver.get_next_version(v1, None)
    assert v1 < v2 and int(v2.split(".")[0]) == 2
    assert saver.get_next_version(v1, None) != saver.get_next_version(v1, None)
    assert saver.get_next_version(7, None).startswith(f"{8:032}.")  # type: ignore[arg-type]


def test_prune_keep_latest_removes_the_bytes(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    big = "x" * 50_000
    cfg = put(saver, "p", v=big + "0")
    for i in range(1, 6):
        cfg = put(saver, "p", cfg, v=big + str(i))
    log = SessionPaths(tmp_path, "langgraph-p").log
    size_before = log.stat().st_size
    saver.prune(["p"])
    # only the newest blob is left, in the snapshot's state of each of the two
    # projections (the full index and the head): 2 of the 6
    assert log.stat().st_size < size_before / 2.5
    assert not SessionPaths(tmp_path, "langgraph-p").archive.exists() or not any(
        SessionPaths(tmp_path, "langgraph-p").archive.iterdir()
    )
    left = list(saver.list({"configurable": {"thread_id": "p"}}))
    assert [t.checkpoint["channel_values"]["v"] for t in left] == [big + "5"]
    assert plain_store(tmp_path).verify("langgraph-p").ok


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
def test_prune_of_a_generator_of_thread_ids_prunes_them(url: str, strategy: str) -> None:
    """Attack: `prune(t for t in ["t"])` (keep_latest) pruned nothing: the DeltaChannel
    check read the generator through, leaving the prune itself no thread. Each thread
    named is pruned (or deleted) as for a list, on every engine."""
    with EventStoreSaver(url) as saver:
        for thread in ("t", "u"):
            put(saver, thread, put(saver, thread, v=1), v=2)
        saver.prune((t for t in ["t", "u"]), strategy=strategy)
        for reader in (saver, EventStoreSaver(url)):
            for thread in ("t", "u"):
                left = list(reader.list({"configurable": {"thread_id": thread}}))
                want = [] if strategy == "delete" else [{"v": 2}]
                assert [tup.checkpoint["channel_values"] for tup in left] == want


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
@pytest.mark.parametrize("bad", ["nul\x00", "x" * 2000, "lone\ud800"])
def test_prune_with_a_bad_thread_id_touches_no_thread(url: str, strategy: str, bad: str) -> None:
    """Attack: `prune(["ok", "nul\\x00"], strategy="delete")` deleted thread "ok", then
    raised InvalidSessionIdError for the next: a bad id with a thread gone, on every
    engine. Every id is checked first: the error names the bad one, no thread changes."""
    with EventStoreSaver(url) as saver:
        put(saver, "ok", put(saver, "ok", v=1), v=2)
        with pytest.raises(InvalidSessionIdError):
            saver.prune(["ok", bad], strategy=strategy)
        assert len(list(saver.list({"configurable": {"thread_id": "ok"}}))) == 2


def test_prune_refuses_an_unknown_strategy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="strategy"):
        EventStoreSaver(tmp_path).prune(["x"], strategy="keep_some")


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
def test_prune_refuses_a_single_thread_id_string(url: str, strategy: str) -> None:
    """Attack: `prune("ab", strategy="delete")` iterated the string and deleted threads
    "a" and "b" (keep_latest pruned them), on every engine. A str is now a TypeError,
    as PostgresSaver raises, and no thread is touched."""
    with EventStoreSaver(url) as saver:
        for thread in ("a", "b"):
            put(saver, thread, put(saver, thread, v=1), v=2)
        with pytest.raises(TypeError, match="not a str"):
            saver.prune("ab", strategy=strategy)
        for thread in ("a", "b"):
            assert len(list(saver.list({"configurable": {"thread_id": thread}}))) == 2


def test_prune_keep_latest_leaves_the_kept_checkpoint_with_no_parent(url: str) -> None:
    """Attack: after `prune(["t"])` the kept checkpoint's `parent_config` still named
    the checkpoint the prune removed (get_tuple of it: None), on every engine.
    PostgresSaver's prune leaves a kept checkpoint whose parent it deletes with no
    parent: every read (the head, the list, a named read, a new saver) now says None."""
    with EventStoreSaver(url) as saver:
        cfg = put(saver, "t", v=0)
        for i in range(1, 4):
            cfg = put(saver, "t", cfg, v=i)
        parent = saver.get_tuple(cfg)
        assert parent is not None and parent.parent_config is not None
        put(saver, "other", put(saver, "other", v=0), v=1)  # not pruned: keeps its parent
        # a thread whose one checkpoint lost its parent to delete_for_runs: PostgresSaver's
        # prune leaves every kept checkpoint whose parent is not kept with none
        put(saver, "runs", put(saver, "runs", run_id="r1", v=0), run_id="r2", v=1)
        saver.delete_for_runs(["r1"])
        saver.prune(["t", "runs"])
        latest: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        for reader in (saver, EventStoreSaver(url)):
            reads = [reader.get_tuple(latest), reader.get_tuple(cfg)]
            reads += list(reader.list({"configurable": {"thread_id": "t"}}))
            assert len(reads) == 3
            for tup in reads:
                assert tup is not None and tup.checkpoint["channel_values"] == {"v": 3}
                assert tup.parent_config is None
            other = reader.get_tuple({"configurable": {"thread_id": "other"}})
            assert other is not None and other.parent_config is not None
            runs = reader.get_tuple({"configurable": {"thread_id": "runs"}})
            assert runs is not None and runs.parent_config is None


def test_a_pruned_thread_idle_since_its_last_put_is_collected_by_gc_idle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a thread last put 60 days ago and pruned today was never idle for `gc
    --idle 30d`: the prune's removal counted as activity, so a thread pruned nightly
    never aged out. A prune is maintenance, as the compaction it ends with is: the
    thread is idle since its last put (also when the prune was killed before compacting).
    A `delete_for_runs` changes what the thread holds: it is activity."""
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=60)
    with EventStoreSaver(tmp_path) as saver:
        with entropy.fixed(3, start=long_ago, step=dt.timedelta(seconds=1)):
            for thread in ("pruned", "half-pruned", "runs-deleted", "untouched"):
                cfg = put(saver, thread, run_id=f"{thread}-1", v=0)
                put(saver, thread, cfg, run_id=f"{thread}-2", v=1)
        saver.prune(["pruned"])
        saver.delete_for_runs(["runs-deleted-1"])
        put(saver, "fresh", v=0)
        with monkeypatch.context() as m:  # a prune killed before its compaction
            m.setattr(saver.store, "compact", lambda *args, **kwargs: None)
            saver.prune(["half-pruned"])
    code, out, err = cli_in_process(capsys, "gc", str(tmp_path), "--idle", "30d", "--json")
    assert code == 0 and err == ""
    assert sorted(json.loads(out)["tombstoned"]) == [
        "langgraph-half-pruned",
        "langgraph-pruned",
        "langgraph-untouched",
    ]


def test_a_pruned_thread_used_since_its_prune_is_not_collected_by_gc_idle(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a prune is maintenance, so `gc --idle` must still see every use of a
    pruned thread after it: writes put after the prune, a thread copied into it, a put
    after a prune killed before its compaction, a `delete_for_runs` before a prune, and a
    fork of a pruned thread made now. On every engine, only the thread left alone since
    its last put 60 days ago is tombstoned."""
    from eventstore import Policy

    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=60)
    used = ["writes", "copied-into", "put-after-killed-prune", "runs-then-pruned"]
    with EventStoreSaver(url) as saver:
        last: dict[str, Any] = {}
        with entropy.fixed(5, start=long_ago, step=dt.timedelta(seconds=1)):
            for thread in [*used, "idle", "source"]:
                cfg = put(saver, thread, run_id=f"{thread}-1", v=0)
                last[thread] = put(saver, thread, cfg, run_id=f"{thread}-2", v=1)
        saver.delete_for_runs(["runs-then-pruned-1"])
        saver.prune(["writes", "copied-into", "runs-then-pruned", "idle"])
        saver.put_writes(last["writes"], [("v", 2)], "task")
        saver.copy_thread("source", "copied-into")
        with monkeypatch.context() as m:  # a prune killed before its compaction
            m.setattr(saver.store, "compact", lambda *args, **kwargs: None)
            saver.prune(["put-after-killed-prune"])
        put(saver, "put-after-killed-prune", v=3)
        saver.store.fork_session(saver.session_id("idle"), saver.session_id("forked"))
        report = saver.store.gc(Policy(idle=dt.timedelta(days=30)))
    assert sorted(report.tombstoned) == ["langgraph-idle", "langgraph-source"]


def test_delete_for_runs_refuses_a_single_run_id_string(url: str) -> None:
    """Attack: `delete_for_runs("ab")` iterated the string and deleted runs "a" and
    "b", on every engine. A str is now InvalidArgumentError (a TypeError, as `prune`
    and PostgresSaver's prune raise for one) and no checkpoint is removed."""
    with EventStoreSaver(url) as saver:
        for run in ("a", "b", "ab"):
            put(saver, f"t-{run}", run_id=run, v=1)
        with pytest.raises(InvalidArgumentError, match="run_ids .*not a str: 'ab'"):
            saver.delete_for_runs("ab")
        for run in ("a", "b", "ab"):
            assert saver.get_tuple({"configurable": {"thread_id": f"t-{run}"}}) is not None
        saver.delete_for_runs(["ab"])  # the one run, named as a sequence of one
        assert saver.get_tuple({"configurable": {"thread_id": "t-ab"}}) is None
        assert saver.get_tuple({"configurable": {"thread_id": "t-a"}}) is not None


@pytest.mark.parametrize("ids", [b"ab", bytearray(b"ab")])
def test_prune_and_delete_for_runs_refuse_bytes(url: str, ids: bytes) -> None:
    """Attack: `prune(b"ab", strategy="delete")` took the bytes as the ids 97 and 98 and
    deleted threads "97" and "98" (`delete_for_runs(b"ab")` their runs), on every engine.
    Bytes are refused as a str is (InvalidArgumentError naming them) and nothing goes."""
    with EventStoreSaver(url) as saver:
        for thread in ("97", "98"):
            put(saver, thread, put(saver, thread, run_id=thread, v=1), run_id=thread, v=2)
        for strategy in ("delete", "keep_latest"):
            with pytest.raises(InvalidArgumentError, match=r"thread_ids .*not (bytes|bytearray)"):
                saver.prune(ids, strategy=strategy)
        with pytest.raises(InvalidArgumentError, match=r"run_ids .*not (bytes|bytearray)"):
            saver.delete_for_runs(ids)
        for thread in ("97", "98"):
            assert len(list(saver.list({"configurable": {"thread_id": thread}}))) == 2


def _appended(state: list[str], writes: list[list[str]]) -> list[str]:
    return [*state, *(w for batch in writes for w in batch)]


class DeltaDoc(TypedDict):
    log: Annotated[list[str], DeltaChannel(_appended)]


def test_prune_keep_latest_refuses_a_thread_of_delta_channels(url: str) -> None:
    """Attack: a `DeltaChannel` keeps its value as writes since its last snapshot, read
    back through the older checkpoints; `prune(keep_latest)` kept only the newest, and
    the graph's state then read `{'log': []}` with no error, on every engine. It now
    raises NotImplementedError (as PostgresSaver does) before pruning any thread of
    the call, and every state reads as before."""
    g = StateGraph(DeltaDoc)
    g.add_node("draft", lambda state: {"log": ["drafted"]})
    g.add_edge(START, "draft")
    g.add_edge("draft", END)
    with EventStoreSaver(url) as saver:
        put(saver, "plain", put(saver, "plain", v=1), v=2)
        graph = g.compile(checkpointer=saver)
        cfg: Any = {"configurable": {"thread_id": "delta"}}
        for i in range(3):
            graph.invoke({"log": [f"in{i}"]}, cfg)
        values = graph.get_state(cfg).values
        assert len(values["log"]) == 6
        with pytest.raises(NotImplementedError, match="DeltaChannel: delta"):
            saver.prune(["plain", "delta"])
        assert graph.get_state(cfg).values == values
        assert len(list(saver.list({"configurable": {"thread_id": "plain"}}))) == 2


def test_a_plainly_opened_store_learns_the_langgraph_events(tmp_path: Path) -> None:
    with SessionStore(tmp_path) as store:
        saver = EventStoreSaver(store)
        cfg = put(saver, "plain", v="x")
        tup = saver.get_tuple(cfg)
        assert tup is not None and tup.checkpoint["channel_values"]["v"] == "x"
        assert store.verify("langgraph-plain").problems == []


def test_delete_thread_removes_its_bytes(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    secret = "the-secret-" + "s" * 40
    cfg = put(saver, "gone", v=secret)
    put(saver, "gone", cfg, v=secret + "2")
    saver.store.compact("langgraph-gone", force=True)  # an archive too
    put(saver, "kept", v="other")
    paths = SessionPaths(tmp_path, "langgraph-gone")
    assert paths.log.exists() and paths.archive.exists()
    needle = base64.b64encode(saver.serde.dumps_typed(secret)[1])[:40]
    assert any(needle in f.read_bytes() for f in paths.dir.rglob("*") if f.is_file())
    saver.delete_thread("gone")
    assert saver.get_tuple({"configurable": {"thread_id": "gone"}}) is None
    assert saver.store.tombstone_of("langgraph-gone") is not None  # the thread stays gone
    assert saver.thread_ids() == ["kept"]
    assert EventStoreSaver(tmp_path).get_tuple({"configurable": {"thread_id": "gone"}}) is None
    # no byte of it is left anywhere under the root (values are stored base64-encoded)
    for f in tmp_path.rglob("*"):
        assert not f.is_file() or needle not in f.read_bytes(), f


@settings(max_examples=25, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=40), min_size=1, max_size=4, unique=True))
def test_any_thread_id_round_trips_and_stays_inside_the_root(
    tmp_path_factory: pytest.TempPathFactory, thread_ids: list[str]
) -> None:
    thread_ids = [t for t in thread_ids if "\x00" not in t] or ["plain"]
    base = tmp_path_factory.mktemp("ids")
    root = base / "store"
    saver = EventStoreSaver(root)
    for t in thread_ids:
        put(saver, t, v=t)
    for t in thread_ids:
        tup = saver.get_tuple({"configurable": {"thread_id": t}})
        assert tup is not None and tup.checkpoint["channel_values"] == {"v": t}
    assert sorted(saver.thread_ids()) == sorted(thread_ids)
    assert sorted(p.name for p in base.iterdir()) == ["store"]  # nothing written beside it


def test_a_bad_thread_id_is_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    for bad in ("x" * 1100, "nul\x00byte"):
        with pytest.raises(InvalidSessionIdError):
            put(saver, bad, v=1)
    assert saver.thread_ids() == []


def test_a_corrupt_thread_log_is_reported_not_skipped(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    cfg = put(saver, "c", v=1)
    put(saver, "c", cfg, v=2)
    log = SessionPaths(tmp_path, "langgraph-c").log
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(lines[0][:40] + b"garbage\n" + lines[1])
    with pytest.raises(CorruptLogError):
        EventStoreSaver(tmp_path).get_tuple({"configurable": {"thread_id": "c"}})


def test_thread_prefix_names_the_sessions(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path, thread_prefix="lg.")
    put(saver, "t1", v=1)
    assert plain_store(tmp_path).list_sessions() == ["lg.t1"]
    assert saver.session_id("t1") == "lg.t1" and saver.thread_ids() == ["t1"]
    assert EventStoreSaver(tmp_path).thread_ids() == []  # another prefix sees no thread


def test_the_newest_checkpoint_follows_removals_and_copies(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    latest: Any = {"configurable": {"thread_id": "a"}}

    def newest(thread: str) -> Any:
        tup = saver.get_tuple({"configurable": {"thread_id": thread}})
        return tup.checkpoint["channel_values"]["v"] if tup else None

    c1 = put(saver, "a", v="one")  # run id "a"
    assert newest("a") == "one"
    c2 = put(saver, "b", v="b-old")  # "b" gets a checkpoint older than a's next one
    put(saver, "a", c1, v="two")
    assert saver.get_tuple(latest) is not None and newest("a") == "two"
    saver.copy_thread("a", "b")  # b's newest is now a's newest ("two")
    assert newest("b") == "two"
    put(saver, "b", c2, v="b-new")
    saver.copy_thread("a", "b")  # copying again must not bring b back to an older one
    assert newest("b") == "b-new"
    put(saver, "a", c1, run_id="late", v="three")
    assert newest("a") == "three"
    saver.delete_for_runs(["late"])  # the newest goes: the one before it is the newest
    assert newest("a") == "two"
    saver.delete_for_runs(["a"])  # every checkpoint put for thread "a" and its copies
    assert newest("a") is None and newest("b") == "b-new"


# -- every base call answers as LangGraph's own InMemorySaver does ----------------------

THREADS = st.sampled_from(["t1", "t2", "t3"])
NAMESPACES = st.sampled_from(["", "child:1"])
INTS = st.integers(-(2**63), 2**63 - 1)  # what the serializer (msgpack) can hold
VALUES = st.one_of(INTS, st.text(max_size=5), st.lists(INTS, max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_base_calls_answer_as_the_in_memory_saver_does(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.memory import InMemorySaver

    ours = EventStoreSaver(tmp_path_factory.mktemp("diff"))
    ref = InMemorySaver()
    stored: list[Any] = []  # configs returned by put
    version = 0
    written: set[str] = set()  # threads with a session
    deleted: set[str] = set()  # threads with a tombstone: a put is refused (InMemorySaver's is not)
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["put", "put", "writes", "get", "list", "delete"]))
        if op == "put":
            thread, ns = data.draw(THREADS), data.draw(NAMESPACES)
            parents = [c for c in stored if c["configurable"]["thread_id"] == thread
                       and c["configurable"]["checkpoint_ns"] == ns]  # fmt: skip
            parent = data.draw(st.sampled_from([None, *parents]))
            values = data.draw(st.dictionaries(st.sampled_from("abc"), VALUES, max_size=3))
            cp = empty_checkpoint()
            version += 1
            new = {ch: f"{version:032}.{i}" for i, ch in enumerate(values)}
            cp["channel_values"] = dict(values)
            cp["channel_versions"] = dict(new)
            cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            if parent is not None:
                cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            metadata: Any = {"source": "loop", "step": version, "run_id": thread}
            if thread in deleted:
                with pytest.raises(SessionDeletedError):
                    ours.put(cfg, cp, metadata, dict(new))
                continue
            written.add(thread)
            got = ours.put(cfg, cp, metadata, dict(new))
            assert got == ref.put(cfg, cp, metadata, dict(new))
            stored.append(got)
        elif op == "writes" and stored:
            target = data.draw(st.sampled_from(stored))
            writes = data.draw(
                st.lists(st.tuples(st.sampled_from(["x", "y", "__error__"]), VALUES), max_size=3)
            )
            task = data.draw(st.sampled_from(["task-a", "task-b"]))
            path = data.draw(st.sampled_from(["", "~p"]))
            ours.put_writes(target, writes, task, path)
            ref.put_writes(target, writes, task, path)
        elif op == "get":
            thread, ns = data.draw(THREADS), data.draw(NAMESPACES)
            pick = data.draw(st.sampled_from([None, *stored]))
            cfg = pick or {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            assert checkpoint_summary(ours.get_tuple(cfg)) == checkpoint_summary(ref.get_tuple(cfg))
        elif op == "list":
            thread, ns = data.draw(THREADS), data.draw(NAMESPACES)
            cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            before = data.draw(st.sampled_from([None, *stored]))
            limit = data.draw(st.one_of(st.none(), st.integers(0, 3)))
            flt = data.draw(st.sampled_from([None, {"source": "loop"}, {"step": 2}]))
            kwargs: Any = {"before": before, "limit": limit, "filter": flt}
            assert [checkpoint_summary(t) for t in ours.list(cfg, **kwargs)] == [
                checkpoint_summary(t) for t in ref.list(cfg, **kwargs)
            ]
        elif op == "delete":
            thread = data.draw(THREADS)
            ours.delete_thread(thread)
            ref.delete_thread(thread)
            stored = [c for c in stored if c["configurable"]["thread_id"] != thread]
            if thread in written:
                deleted.add(thread)
    everything = sorted((checkpoint_summary(t) for t in ours.list(None)), key=repr)
    assert everything == sorted((checkpoint_summary(t) for t in ref.list(None)), key=repr)


def test_prune_after_an_archived_compaction_keeps_that_archive(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    cfg = put(saver, "p", v="a" * 5000)
    cfg = put(saver, "p", cfg, v="b" * 5000)
    saver.store.compact("langgraph-p", force=True)  # the user chose to archive events 1..2
    cfg = put(saver, "p", cfg, v="c" * 5000)
    paths = SessionPaths(tmp_path, "langgraph-p")
    archived = {f.name: f.read_bytes() for f in paths.archive.iterdir()}
    size_before = paths.log.stat().st_size
    saver.prune(["p"])
    # 3 blobs before (a and b in the snapshot, c), 2 after: c in the snapshot's state of
    # each of the two projections (the full index and the head)
    assert paths.log.stat().st_size < size_before * 0.6
    assert {f.name: f.read_bytes() for f in paths.archive.iterdir()} == archived
    left = list(saver.list({"configurable": {"thread_id": "p"}}))
    assert [t.checkpoint["channel_values"]["v"] for t in left] == ["c" * 5000]


# fixed by issue 12 item 8 (verify: a history_gap warning, not an archive_chain error)
def test_prune_after_an_archived_compaction_verifies(tmp_path: Path) -> None:
    saver = EventStoreSaver(tmp_path)
    cfg = put(saver, "p", v="a")
    cfg = put(saver, "p", cfg, v="b")
    saver.store.compact("langgraph-p", force=True)
    put(saver, "p", cfg, v="c")
    saver.prune(["p"])
    assert plain_store(tmp_path).verify("langgraph-p").ok


# -- attacks -------------------------------------------------------------------------------


def _langgraph() -> Any:
    pytest.importorskip("langgraph.checkpoint.base")
    from eventstore.integrations import langgraph

    return langgraph


def _checkpoint(saver: Any, cid: str, values: dict[str, Any]) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    c = empty_checkpoint()
    c["id"] = cid
    c["channel_values"] = dict(values)
    c["channel_versions"] = {ch: saver.get_next_version(None, None) for ch in values}
    return c


def test_langgraph_odd_channel_values_round_trip_as_in_memory_saver(tmp_path: Path) -> None:
    """Coverage: values LangGraph's serde handles (bytes, NaN, sets, tuples, datetimes,
    nested) read back as InMemorySaver gives them, in the checkpoint, its metadata and
    its pending writes, from a new saver too."""
    lg = _langgraph()
    from langgraph.checkpoint.memory import InMemorySaver

    values = {
        "b": b"\x00\xff" * 1000,
        "nan": float("nan"),
        "nested": {"a": [1, {"t": (1, 2)}], "s": {1, 2}},
        "when": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    }
    cfg: Any = {"configurable": {"thread_id": "odd\u00e9/..", "checkpoint_ns": ""}}
    answers = []
    for saver in (InMemorySaver(), lg.EventStoreSaver(tmp_path)):
        c = _checkpoint(saver, "1ef00000-0000-6000-8000-000000000001", values)
        written = saver.put(cfg, c, {"step": 1, "odd": values}, c["channel_versions"])
        saver.put_writes(written, [("b", b"\x01"), ("nan", float("nan"))], "task-1")
        if isinstance(saver, lg.EventStoreSaver):
            saver.close()
            saver = lg.EventStoreSaver(tmp_path)
        tup = saver.get_tuple(cfg)
        answers.append((tup.checkpoint["channel_values"], tup.metadata["odd"], tup.pending_writes))
        if isinstance(saver, lg.EventStoreSaver):
            saver.close()
    mem, ours = answers
    assert same_value(ours[0], mem[0]) and same_value(ours[1], mem[1])
    assert len(ours[2]) == 2 and ours[2][0] == mem[2][0] and math.isnan(ours[2][1][2])


def _lg_writer(root: str, worker: int, fd: int) -> None:
    from eventstore.integrations.langgraph import EventStoreSaver

    saver = EventStoreSaver(root)
    cfg: Any = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    for i in range(100_000):
        cid = f"1ef{i:08d}-{worker}"
        c = _checkpoint(saver, cid, {"v": "x" * 50_000, "w": worker})
        cfg = saver.put(cfg, c, {"step": i, "worker": worker}, c["channel_versions"])
        os.write(fd, f"{cid}\n".encode())  # acknowledged


def test_langgraph_writers_killed_mid_put_on_one_thread_lose_nothing(tmp_path: Path) -> None:
    """Coverage: two processes put checkpoints (50 kB values) into one thread id and are
    SIGKILLed at once; every acknowledged checkpoint is listed, with its parent, and the
    thread verifies and takes further puts."""
    lg = _langgraph()
    ctx = multiprocessing.get_context("fork")
    r, w = os.pipe()
    procs = [ctx.Process(target=_lg_writer, args=(str(tmp_path), k, w)) for k in range(2)]
    for p in procs:
        p.start()
    os.close(w)
    acked: list[str] = []
    buf = b""
    deadline = time.monotonic() + 20
    while len(acked) < 40 and time.monotonic() < deadline:
        buf += os.read(r, 4096)
        *done, buf = buf.split(b"\n")
        acked += [d.decode() for d in done]
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
    while chunk := os.read(r, 4096):
        buf += chunk
    os.close(r)
    acked += [d.decode() for d in buf.split(b"\n")[:-1]]
    assert len(acked) >= 40
    cfg: Any = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    with lg.EventStoreSaver(tmp_path) as saver:
        listed = {t.checkpoint["id"]: t for t in saver.list(cfg)}
        assert set(acked) <= set(listed)
        for cid, t in listed.items():
            step = int(cid[3:11])
            parent = t.parent_config
            assert (parent is None) == (step == 0)
            if parent is not None:
                assert parent["configurable"]["checkpoint_id"] == f"1ef{step - 1:08d}{cid[11:]}"
        c = _checkpoint(saver, "1ef99999999-9", {"v": "after"})
        saver.put(cfg, c, {"step": 0}, c["channel_versions"])
        assert saver.get_tuple(cfg).checkpoint["channel_values"] == {"v": "after"}
        assert saver.store.verify(saver.session_id("shared")).ok


def test_langgraph_a_thread_deleted_and_rewritten_elsewhere_reads_fresh(tmp_path: Path) -> None:
    """Coverage: saver A holds a thread's head; saver B (its own store, as another
    process) deletes the thread and writes a new one; A and a new saver read only the
    new thread, and it verifies."""
    lg = _langgraph()
    cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    a, b = lg.EventStoreSaver(tmp_path), lg.EventStoreSaver(tmp_path)
    try:
        conf = cfg
        for i in range(5):
            c = _checkpoint(a, f"1ef{i:05d}", {"x": i})
            conf = a.put(conf, c, {"step": i}, c["channel_versions"])
        a.put_writes(conf, [("x", "pending")], "task")
        assert a.get_tuple(cfg).checkpoint["id"] == "1ef00004"
        b.delete_thread("t")
        assert a.get_tuple(cfg) is None and list(a.list(cfg)) == []
        c = _checkpoint(b, "1ef00001", {"x": "new"})
        with pytest.raises(SessionDeletedError):  # a late write: the thread stays gone
            a.put(cfg, c, {"step": 0}, c["channel_versions"])
        assert b.store.restore(b.session_id("t"))  # the id, used again on purpose
        b.put(cfg, c, {"step": 0}, c["channel_versions"])
        for saver in (a, b, lg.EventStoreSaver(tmp_path)):
            tup = saver.get_tuple(cfg)
            assert tup.checkpoint["channel_values"] == {"x": "new"}
            assert tup.pending_writes == []
            assert [t.checkpoint["id"] for t in saver.list(cfg)] == ["1ef00001"]
        assert a.store.verify(a.session_id("t")).ok
    finally:
        a.close()
        b.close()
