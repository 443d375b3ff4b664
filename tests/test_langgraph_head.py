"""The LangGraph saver's fast cold reads: the `langgraph_head` projection (each
namespace's newest checkpoint, kept in the fold cache) must answer exactly as the full
index and as LangGraph's own InMemorySaver do, whatever the sequence of calls; a cold
process (a new saver on the same store, reading the fold cache) must answer as the warm
one did; a damaged or stale cache must be ignored or caught up, never trusted; a log
whose snapshot predates the head projection must still read.
"""

from __future__ import annotations

import gc
import json
import operator
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import pytest
from conftest import cache_path, checkpoint_summary, run_threads
from engines import EngineCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import WRITES_IDX_MAP, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

import eventstore.core.tuning
from eventstore import SessionStore
from eventstore.engines.file.layout import SessionPaths
from eventstore.errors import CorruptLogError
from eventstore.integrations import langgraph as lg
from eventstore.integrations.langgraph import EventStoreSaver
from eventstore.integrations.langgraph_lines import LINES_PROJECTION, indexed_checkpoint
from eventstore.integrations.langgraph_state import (
    BlobEntry,
    BlobPut,
    CheckpointEntry,
    CheckpointPut,
    CheckpointsRemoved,
    HeadEntry,
    NamespaceHead,
    NewestEntry,
    ThreadCopied,
    TypedValue,
    WriteRecord,
    WritesEntry,
    WritesPut,
    blob_key,
    checkpoint_key,
    newest_key,
    whole_blob,
    writes_key,
)
from eventstore.ops.seek import can_seek

THREADS = ["t1", "t2", "t3"]
NAMESPACES = ["", "child:1"]
VALUES = st.one_of(st.integers(-1000, 1000), st.text(max_size=5))
# a small pool of checkpoint ids, so puts arrive out of order and ids repeat (retries)
IDS = st.sampled_from([f"1ef{n:03}" for n in range(12)])


def _latest(thread: str, ns: str) -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}


def _full_latest(saver: EventStoreSaver, thread: str, ns: str) -> Any:
    """The newest checkpoint as the full index alone answers (the reference)."""
    state = saver._state(thread)
    newest = state.get(newest_key(ns))
    if not isinstance(newest, NewestEntry) or not newest.checkpoint_id:
        return None
    entry = state.get(checkpoint_key(ns, newest.checkpoint_id))
    assert isinstance(entry, CheckpointEntry)
    return saver._tuple_in(thread, entry, state)


def _check_heads(full: Any, heads: Any) -> int:
    """Every head the head projection claims to know is the full index's newest: its
    entry, its blobs and its writes; ids above `max_id` were never put; early writes
    are the full index's. Returns how many heads are known."""
    known = 0
    namespaces = set(heads) | {e.ns for e in full.values() if isinstance(e, CheckpointEntry)}
    for ns in namespaces:
        ids = [
            e.checkpoint_id for e in full.values() if isinstance(e, CheckpointEntry) and e.ns == ns
        ]
        nh = heads.get(ns)
        if nh is None or nh.max_id is None:
            assert ids == [], (ns, nh)
            continue
        assert all(i <= nh.max_id for i in ids)
        for cid, w in nh.early.items():
            assert cid > nh.max_id and full.get(writes_key(ns, cid)) == w
        for k, w in full.items():
            if isinstance(w, WritesEntry) and w.ns == ns and w.checkpoint_id > nh.max_id:
                assert nh.early.get(w.checkpoint_id) == w, k
        if nh.head is None:
            continue
        known += 1
        head = nh.head
        cid = head.checkpoint.checkpoint_id
        assert cid == nh.max_id == max(ids)
        assert full[checkpoint_key(ns, cid)] == head.checkpoint
        assert head.blobs == {
            ch: full[blob_key(ns, ch, v)] for ch, v in head.checkpoint.versions.items()
        }
        assert full.get(writes_key(ns, cid)) == head.writes
    return known


def _check_heads_against_the_full_index(saver: EventStoreSaver, thread: str) -> int:
    heads = saver._heads(thread)
    assert heads is not None
    return _check_heads(saver._state(thread), heads)


# -- the projections alone, on any events (also ones the saver never writes) ------------

_TV = st.builds(lambda b: TypedValue("msgpack", b), st.sampled_from([b"a", b"b", b"c"]))
_PIDS = st.sampled_from(["1", "2", "3", "4"])
_PNS = st.sampled_from(["", "n"])
_PVERS = st.sampled_from(["1", "2", "3"])


@st.composite
def _events(draw: Any, depth: int = 1) -> list[Any]:
    out: list[Any] = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["put", "put", "writes", "removed", "copied"]))
        if kind == "put":
            versions = draw(st.dictionaries(st.sampled_from("ab"), _PVERS, max_size=2))
            blobs = draw(
                st.lists(
                    st.builds(BlobPut, st.sampled_from("ab"), _PVERS, st.one_of(st.none(), _TV)),
                    max_size=3,
                )
            )
            out.append(
                CheckpointPut(
                    ns=draw(_PNS),
                    checkpoint_id=draw(_PIDS),
                    versions=versions,
                    checkpoint=draw(_TV),
                    metadata=draw(_TV),
                    blobs=blobs,
                )
            )
        elif kind == "writes":
            record = st.builds(
                WriteRecord, st.sampled_from(["t1", "t2"]), st.integers(-2, 1),
                st.sampled_from("xy"), _TV,
            )  # fmt: skip
            out.append(
                WritesPut(
                    ns=draw(_PNS),
                    checkpoint_id=draw(_PIDS),
                    writes=draw(st.lists(record, min_size=1, max_size=2)),
                )
            )
        elif kind == "removed":
            pairs = draw(st.lists(st.tuples(_PNS, _PIDS), min_size=1, max_size=3))
            out.append(CheckpointsRemoved(checkpoints=pairs, reason="test"))
        elif depth > 0:
            source = lg.PROJECTION.initial()
            for ev in draw(_events(depth=0)):
                source = lg.PROJECTION.apply(source, ev)
            out.append(ThreadCopied(source_thread_id="other", entries=dict(source)))
    return out


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(_events())
def test_the_head_projection_agrees_with_the_full_one_on_any_events(events: list[Any]) -> None:
    full, heads = lg.PROJECTION.initial(), lg.HEAD_PROJECTION.initial()
    for ev in events:
        full = lg.PROJECTION.apply(full, ev)
        heads = lg.HEAD_PROJECTION.apply(heads, ev)
        _check_heads(full, heads)
    head = lg.HEAD_PROJECTION
    assert head.decode_state(head.encode_state(heads)) == heads
    # the fold cache's encoding, and the JSON caches of earlier versions
    assert head.decode_cache(head.encode_cache(heads)) == heads
    assert head.decode_cache(head.encode_state(heads)) == heads


class _Driver:
    """Draws saver calls and applies them to our saver (and a reference, if any)."""

    def __init__(self, data: st.DataObject, ours: EventStoreSaver, ref: Any = None) -> None:
        self.data = data
        self.ours = ours
        self.ref = ref
        self.stored: list[Any] = []  # configs put returned
        self.n = 0

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def both(self, call: str, *args: Any) -> Any:
        got = getattr(self.ours, call)(*args)
        if self.ref is not None:
            assert got == getattr(self.ref, call)(*args)
        return got

    def put(self) -> None:
        thread, ns = self.draw(st.sampled_from(THREADS)), self.draw(st.sampled_from(NAMESPACES))
        here = [
            c
            for c in self.stored
            if c["configurable"]["thread_id"] == thread and c["configurable"]["checkpoint_ns"] == ns
        ]
        parent = self.draw(st.sampled_from([None, *here]))
        parent_versions: dict[str, Any] = {}
        if parent is not None:
            tup = self.ours.get_tuple(parent)
            parent_versions = dict(tup.checkpoint["channel_versions"]) if tup else {}
        changed = self.draw(st.dictionaries(st.sampled_from("abc"), VALUES, max_size=3))
        self.n += 1
        cp = empty_checkpoint()
        if self.draw(st.booleans()):
            cp["id"] = self.draw(IDS)  # out of order, or the id of an earlier put
        # a fresh version per changed channel, or one from a small pool, so a put may
        # rewrite the blob another checkpoint holds at that version (as the
        # conformance suite's integer versions do)
        pool = st.sampled_from(["1", "2", f"{self.n:032}"])
        new = {ch: self.draw(pool) for ch in changed}
        versions = {**parent_versions, **new}
        if self.draw(st.integers(0, 9)) == 0:
            versions["z"] = "00000000000000000000000000000000.9"  # no blob was ever put
        cp["channel_versions"] = versions
        cp["channel_values"] = dict(changed)
        cfg: Any = _latest(thread, ns)
        if parent is not None:
            cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        metadata: Any = {"source": "loop", "step": self.n, "run_id": f"run-{self.n % 3}"}
        self.stored.append(self.both("put", cfg, cp, metadata, dict(new)))

    def writes(self) -> None:
        if not self.stored or self.draw(st.integers(0, 4)) == 0:
            thread, ns = self.draw(st.sampled_from(THREADS)), self.draw(st.sampled_from(NAMESPACES))
            target: Any = _latest(thread, ns)  # against an id not put (yet)
            target["configurable"]["checkpoint_id"] = self.draw(IDS)
        else:
            target = self.draw(st.sampled_from(self.stored))
        channels = st.sampled_from(["x", "y", *WRITES_IDX_MAP])
        writes = self.draw(st.lists(st.tuples(channels, VALUES), max_size=3))
        task = self.draw(st.sampled_from(["task-a", "task-b"]))
        self.both("put_writes", target, writes, task, self.draw(st.sampled_from(["", "~p"])))

    def delete(self) -> None:
        thread = self.draw(st.sampled_from(THREADS))
        self.both("delete_thread", thread)
        # InMemorySaver takes writes to a deleted thread; ours refuses them (a tombstone:
        # tests/test_tombstones.py) until the id is restored, as done here
        self.ours.store.restore(self.ours.session_id(thread))
        self.stored = [c for c in self.stored if c["configurable"]["thread_id"] != thread]

    def step(self, ops: list[str]) -> str:
        op: str = self.draw(st.sampled_from(ops))
        if op == "put":
            self.put()
        elif op == "writes":
            self.writes()
        elif op == "delete":
            self.delete()
        elif op == "copy":
            src, dst = self.draw(st.sampled_from(THREADS)), self.draw(st.sampled_from(THREADS))
            self.ours.copy_thread(src, dst)
        elif op == "delete_runs":
            self.ours.delete_for_runs([f"run-{self.draw(st.integers(0, 2))}"])
        elif op == "prune":
            self.ours.prune([self.draw(st.sampled_from(THREADS))])
        elif op == "compact" and self.stored:
            thread = self.draw(st.sampled_from(self.stored))["configurable"]["thread_id"]
            self.ours.store.compact(self.ours.session_id(thread), force=True)
        return op


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_reads_answer_as_the_in_memory_saver_does(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    ours = EventStoreSaver(tmp_path_factory.mktemp("head"))
    driver = _Driver(data, ours, InMemorySaver())
    for _ in range(data.draw(st.integers(1, 30))):
        driver.step(["put", "put", "put", "writes", "writes", "delete"])
        for thread in THREADS:
            for ns in NAMESPACES:
                cfg = _latest(thread, ns)
                assert checkpoint_summary(ours.get_tuple(cfg)) == checkpoint_summary(
                    driver.ref.get_tuple(cfg)
                )
        picked = data.draw(st.sampled_from([None, *driver.stored]))
        if picked is not None:
            assert checkpoint_summary(ours.get_tuple(picked)) == checkpoint_summary(
                driver.ref.get_tuple(picked)
            )
    ours.close()


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_head_is_the_full_index_newest_after_any_calls(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """With the calls InMemorySaver lacks too (copies, removals by run, prunes): every
    head known is exact, and get_tuple answers as the full index does."""
    ours = EventStoreSaver(tmp_path_factory.mktemp("head-full"))
    driver = _Driver(data, ours)
    ops = ["put", "put", "put", "writes", "writes", "delete", "copy", "delete_runs", "prune"]
    for _ in range(data.draw(st.integers(1, 30))):
        driver.step(ops)
        for thread in THREADS:
            _check_heads_against_the_full_index(ours, thread)
            for ns in NAMESPACES:
                got = checkpoint_summary(ours.get_tuple(_latest(thread, ns)))
                assert got == checkpoint_summary(_full_latest(ours, thread, ns))
    ours.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_cold_saver_answers_as_the_warm_one_did(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("cold")
    old = eventstore.core.tuning.DEFAULT_TUNING
    eventstore.core.tuning.DEFAULT_TUNING = eventstore.core.tuning.Tuning(
        cache_on_close=0
    )  # every close leaves its caches
    try:
        warm = EventStoreSaver(root)
        driver = _Driver(data, warm)
        ops = ["put", "put", "put", "writes", "delete", "copy", "delete_runs", "prune"]
        for _ in range(data.draw(st.integers(1, 25))):
            driver.step(ops)
        cfgs = [_latest(t, ns) for t in THREADS for ns in NAMESPACES] + driver.stored
        answers = [checkpoint_summary(warm.get_tuple(c)) for c in cfgs]
        listed = [checkpoint_summary(t) for t in warm.list(None)]
        warm.close()
        cold = EventStoreSaver(root)
        assert [checkpoint_summary(cold.get_tuple(c)) for c in cfgs] == answers
        assert [checkpoint_summary(t) for t in cold.list(None)] == listed
        cold.close()
    finally:
        eventstore.core.tuning.DEFAULT_TUNING = old


# -- a named older checkpoint, read from the log (eventstore.integrations.langgraph_older)


def _listed(saver: EventStoreSaver) -> dict[tuple[str, str, str], Any]:
    """Every checkpoint as `list` answers it (from the full index), by thread, ns, id."""
    out = {}
    for t in saver.list(None):
        conf = t.config["configurable"]
        out[conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"]] = checkpoint_summary(t)
    return out


def _named(thread: str, ns: str, checkpoint_id: str) -> Any:
    cfg = _latest(thread, ns)
    cfg["configurable"]["checkpoint_id"] = checkpoint_id
    return cfg


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_named_checkpoint_read_from_the_log_answers_as_the_full_index(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """A fresh saver's `get_tuple` of any named checkpoint, or of an id never put,
    answers as the full index does after any calls (rewritten blob versions, writes
    before their checkpoint, removals, copies, deletions and compactions included:
    where the read from the log gives up, the full index answers)."""
    root = tmp_path_factory.mktemp("older")
    with EventStoreSaver(root) as warm:
        driver = _Driver(data, warm)
        ops = ["put", "put", "put", "writes", "writes", "delete", "copy", "delete_runs"]
        ops += ["prune", "compact"]
        for _ in range(data.draw(st.integers(1, 30))):
            driver.step(ops)
    with EventStoreSaver(root) as full:
        expected = _listed(full)
    keys = {(t, ns, i) for t in THREADS for ns in NAMESPACES for i in ["1ef000", "1ef011"]}
    keys |= set(expected)
    with EventStoreSaver(root) as cold:
        for key in sorted(keys):
            assert checkpoint_summary(cold.get_tuple(_named(*key))) == expected.get(key)


def _messages_thread(saver: EventStoreSaver, thread: str, n: int, ns: str = "") -> list[Any]:
    """`n` checkpoints whose "messages" channel grows by a message each (stored as
    deltas), "k" kept from the first, a write on every third; their configs."""
    cfg: Any = _latest(thread, ns)
    versions: dict[str, Any] = {}
    messages: list[str] = []
    configs = []
    for i in range(n):
        messages.append(f"message {i} " + "m" * 300)
        cp = empty_checkpoint()
        new = {"messages": saver.get_next_version(versions.get("messages"), None)}
        if i == 0:
            new["k"] = saver.get_next_version(None, None)
        versions.update(new)
        cp["channel_versions"] = dict(versions)
        cp["channel_values"] = {"messages": list(messages), "k": "kept"}
        cfg = saver.put(cfg, cp, {"source": "loop", "step": i}, dict(new))
        configs.append(cfg)
        if i % 3 == 0:
            saver.put_writes(cfg, [("messages", i)], f"task-{i}")
    return configs


def test_a_named_older_checkpoint_is_read_from_the_log_not_the_full_index(
    tmp_path: Path,
) -> None:
    with EventStoreSaver(tmp_path) as saver:
        configs = _messages_thread(saver, "t", 40)
    log = SessionPaths(tmp_path, "langgraph-t").log
    assert log.stat().st_size < 40 * 40 * 300  # deltas: not every list whole
    with EventStoreSaver(tmp_path) as full:
        expected = _listed(full)
    with EventStoreSaver(tmp_path) as cold:
        for cfg in reversed(configs):
            key = ("t", "", cfg["configurable"]["checkpoint_id"])
            assert checkpoint_summary(cold.get_tuple(cfg)) == expected[key]
        assert cold.get_tuple(_named("t", "", "1ef000")) is None  # never put
        assert "langgraph" not in cold.store.cache_info("langgraph-t").folds  # never folded


def _damage(log: Path, needle: bytes) -> None:
    """Change one base64 character of the line holding `needle` (JSON stays valid)."""
    data = bytearray(log.read_bytes())
    at = data.index(needle)
    start = data.rindex(b"\n", 0, at) + 1
    i = data.index(b'["msgpack","', start) + 14
    data[i] = ord("A") if data[i] != ord("A") else ord("B")
    log.write_bytes(bytes(data))


@pytest.mark.parametrize("read", ["search", "index"])
def test_a_damaged_line_a_named_read_needs_is_an_error_and_others_are_not_read(
    tmp_path: Path, read: str
) -> None:
    # without a cache of its index of lines (deleted: caches may be), a fresh saver
    # searches the log; with one, the lines after that cache are folded into it
    n = 12 if read == "search" else 40
    with EventStoreSaver(tmp_path) as saver:
        configs = _messages_thread(saver, "t", n)
    lines_cache = cache_path(tmp_path, "langgraph-t", "langgraph_lines")
    assert lines_cache.exists()
    if read == "search":
        lines_cache.unlink()
    with EventStoreSaver(tmp_path) as full:
        expected = _listed(full)
    log = SessionPaths(tmp_path, "langgraph-t").log
    middle, later = configs[n // 2 - 1], configs[n - 3]
    # a line of the newer checkpoint only: the read of the middle one needs none of it
    _damage(log, b'"checkpoint_id":"' + later["configurable"]["checkpoint_id"].encode())
    with EventStoreSaver(tmp_path) as cold:
        key = ("t", "", middle["configurable"]["checkpoint_id"])
        assert checkpoint_summary(cold.get_tuple(middle)) == expected[key]
    # the middle checkpoint's own line: the full index is folded, and says where
    _damage(log, b'"checkpoint_id":"' + middle["configurable"]["checkpoint_id"].encode())
    with EventStoreSaver(tmp_path) as cold, pytest.raises(CorruptLogError, match="log.jsonl"):
        cold.get_tuple(middle)


@pytest.mark.parametrize("also", ["appends", "compacts"])
def test_named_reads_beside_a_writer_answer_as_before_it(
    case: EngineCase, url: str, also: str
) -> None:
    """Another store appends to the thread (another namespace), and compacts it too,
    while a fresh saver reads its older checkpoints from the log, on every engine: each
    read sees one consistent log, and what another writer does between its reads
    changes nothing it returns (a compacted thread is read by folding)."""
    with EventStoreSaver(url) as saver:
        configs = _messages_thread(saver, "t", 30)
    with EventStoreSaver(url) as full:
        expected = _listed(full)
    done = threading.Event()

    def write() -> None:
        with EventStoreSaver(url) as writer:
            for _ in range(40):  # (bounded: on the memory engine it outruns any reader)
                if done.is_set():
                    break
                _messages_thread(writer, "t", 5, ns="child:1")
                if also == "compacts":
                    writer.store.compact("langgraph-t", force=True)

    def read() -> None:
        try:
            for _ in range(3):
                with EventStoreSaver(url) as cold:
                    for cfg in configs[::3]:
                        key = ("t", "", cfg["configurable"]["checkpoint_id"])
                        assert checkpoint_summary(cold.get_tuple(cfg)) == expected[key]
                    folded = "langgraph" in cold.store.cache_info("langgraph-t").folds
                    if also == "appends":  # (every engine reads lines by bytes or seqs)
                        assert folded is False
        finally:
            done.set()

    assert run_threads([write, read]) == []


def _indexed_expected(full: Any, ns: str, checkpoint_id: str) -> HeadEntry | None:
    """What the full index holds of a checkpoint, as the index of lines answers it."""
    entry = full.get(checkpoint_key(ns, checkpoint_id))
    if not isinstance(entry, CheckpointEntry):
        return None
    blobs = {
        ch: whole_blob(full[blob_key(ns, ch, v)])
        for ch, v in entry.versions.items()
        if blob_key(ns, ch, v) in full
    }
    writes = full.get(writes_key(ns, checkpoint_id))
    return HeadEntry(entry, blobs, writes if isinstance(writes, WritesEntry) else None)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_the_index_of_lines_reads_a_checkpoint_as_the_full_index(
    case: EngineCase, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """After any calls, a cold store's index of lines answers every named checkpoint
    (and ids never put) exactly as the full index holds it, whenever the index is
    complete (a thread of puts and writes only) and the engine reads lines by seq
    (files by their bytes, PostgreSQL by its key); it answers nothing once a removal, a
    copy, a deletion or a compaction touched the thread (the saver reads another way)."""
    root = case.fresh(tmp_path_factory.mktemp("lines"))
    with EventStoreSaver(root) as warm:
        driver = _Driver(data, warm)
        ops = ["put"] * 6 + ["writes"] * 3 + ["delete", "copy", "delete_runs", "prune", "compact"]
        for _ in range(data.draw(st.integers(1, 30))):
            driver.step(ops)
    ids = {i for c in driver.stored for i in [c["configurable"]["checkpoint_id"]]}
    with SessionStore(root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS) as cold:
        for thread in THREADS:
            sid = f"langgraph-{thread}"
            full = cold.load(sid, lg.PROJECTION)
            complete = can_seek(cold) and cold.load(sid, LINES_PROJECTION).complete
            for ns in NAMESPACES:
                for cid in sorted(ids | {"1ef000", "1ef011"}):
                    got = indexed_checkpoint(cold, sid, ns, cid)
                    if complete:
                        assert got is not None and got.found == _indexed_expected(full, ns, cid)
                    else:
                        assert got is None


class _SpanSpy:
    """The log bytes the ranged reads of a store read (its engine's `live_view`)."""

    def __init__(self, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read = 0
        engine: Any = store.engine
        real = engine.live_view

        @contextmanager
        def live_view(sid: str) -> Iterator[Any]:
            with real(sid) as view:
                inner = view.read_span

                def read_span(start: int, end: int) -> bytes:
                    data = inner(start, end)
                    self.read += len(data)
                    return data

                yield msgspec.structs.replace(view, read_span=read_span)

        monkeypatch.setattr(engine, "live_view", live_view)


def test_a_named_checkpoint_is_read_through_the_index_of_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold saver reads any named checkpoint of a long thread from the few lines its
    index names, never folding the full index. (Whole blobs here: with deltas, the
    lines of a blob's delta chain are read too.)"""
    with EventStoreSaver(tmp_path, delta_blobs=False) as saver:
        configs = _messages_thread(saver, "t", 120)
    log = SessionPaths(tmp_path, "langgraph-t").log
    assert cache_path(tmp_path, "langgraph-t", "langgraph_lines").exists()
    with EventStoreSaver(tmp_path) as full:
        expected = _listed(full)
    with EventStoreSaver(tmp_path) as cold:
        spy = _SpanSpy(cold.store, monkeypatch)
        for cfg in configs[::7]:
            key = ("t", "", cfg["configurable"]["checkpoint_id"])
            before = spy.read
            assert checkpoint_summary(cold.get_tuple(cfg)) == expected[key]
            assert spy.read - before < log.stat().st_size / 4  # a search reads it all
        assert cold.get_tuple(_named("t", "", "1ef000")) is None  # never put
        assert "langgraph" not in cold.store.cache_info("langgraph-t").folds


def test_named_checkpoints_are_read_by_seq_on_every_engine_that_can(
    case: EngineCase, url: str
) -> None:
    """On every engine, a cold saver answers each named checkpoint of a thread of
    deltas, writes and a channel kept from the first step as the full index does; where
    the engine reads lines by their bytes or seqs (files, memory, PostgreSQL, Redis),
    from the lines its index names, never folding the full index."""
    with EventStoreSaver(url) as saver:
        configs = _messages_thread(saver, "t", 40)
    with EventStoreSaver(url) as full:
        expected = _listed(full)
    with EventStoreSaver(url) as cold:
        for cfg in configs[::-3]:
            key = ("t", "", cfg["configurable"]["checkpoint_id"])
            assert checkpoint_summary(cold.get_tuple(cfg)) == expected[key]
        assert "langgraph" not in cold.store.cache_info("langgraph-t").folds


def test_a_compacted_thread_has_no_index_of_lines_and_still_reads(tmp_path: Path) -> None:
    """Snapshots never store the index (its seqs name lines compaction archives): after
    a compaction a named read answers from the log's other reads, and verify passes."""
    with EventStoreSaver(tmp_path) as saver:
        configs = _messages_thread(saver, "t", 30)
        assert saver.store.compact("langgraph-t", force=True).compacted
        configs += _messages_thread(saver, "t", 3)
    log = SessionPaths(tmp_path, "langgraph-t").log
    assert b"langgraph_lines" not in log.read_bytes()
    with EventStoreSaver(tmp_path) as full:
        expected = _listed(full)
    with EventStoreSaver(tmp_path) as cold:
        assert not cold.store.load("langgraph-t", LINES_PROJECTION).complete
        for cfg in configs[::4]:
            key = ("t", "", cfg["configurable"]["checkpoint_id"])
            assert checkpoint_summary(cold.get_tuple(cfg)) == expected[key]
        assert cold.store.verify("langgraph-t").ok


def test_a_named_read_of_an_encrypted_thread_folds_the_full_index(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from eventstore import KeyRing

    def store() -> SessionStore:
        return SessionStore(tmp_path, keys=KeyRing({"m1": bytes(range(32))}))

    with store() as s, EventStoreSaver(s) as saver:
        configs = _messages_thread(saver, "t", 6)
    with store() as s, EventStoreSaver(s) as full:
        expected = _listed(full)
    with store() as s, EventStoreSaver(s) as cold:
        for cfg in configs:
            key = ("t", "", cfg["configurable"]["checkpoint_id"])
            assert checkpoint_summary(cold.get_tuple(cfg)) == expected[key]
        assert "langgraph" in cold.store.cache_info("langgraph-t").folds


# -- what a cold read costs: the fold cache, and never the full index for the latest ----


def _chain(saver: EventStoreSaver, thread: str, n: int, size: int = 2000) -> Any:
    """`n` checkpoints, each changing channel "v" (a `size`-character value) and
    keeping channel "k" from the first, with a write on every third."""
    cfg: Any = _latest(thread, "")
    versions: dict[str, Any] = {}
    for i in range(n):
        cp = empty_checkpoint()
        new: dict[str, str | int | float] = {"v": saver.get_next_version(versions.get("v"), None)}
        if i == 0:
            new["k"] = saver.get_next_version(None, None)
        versions.update(new)
        cp["channel_versions"] = dict(versions)
        # consecutive values differ throughout: stored whole, never as deltas, so the
        # log is as long as these tests need
        cp["channel_values"] = {"v": f"{i}:" + "xy"[i % 2] * size, "k": "kept"}
        cfg = saver.put(cfg, cp, {"source": "loop", "step": i}, new)
        if i % 3 == 0:
            saver.put_writes(cfg, [("v", i)], f"task-{i}")
    return cfg


def test_a_thread_the_store_let_go_has_its_head_kept_again(tmp_path: Path) -> None:
    """A long-lived saver over more threads than its store keeps: a thread whose session
    the store let go, put to again, has its head folded and kept current again, as on
    its first put (so close leaves it in the fold cache for the next process)."""
    store = SessionStore(tmp_path, cached_sessions=1)
    with store, EventStoreSaver(store, delta_blobs=False) as saver:
        for thread in ("a", "b", "a"):
            _chain(saver, thread, 2)
            folds = store.cache_info(f"langgraph-{thread}").folds
            assert "langgraph_head" in folds, (thread, folds)
        assert "langgraph_head" not in store.cache_info("langgraph-b").folds  # let go


class _ReadSpy:
    """The log bytes each projection's loads read."""

    def __init__(self, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read = 0
        real = store.engine.read_some

        def read_some(sid: str, position: Any, limit: int) -> Any:
            res, more = real(sid, position, limit)
            self.read += len(res.data)
            return res, more

        monkeypatch.setattr(store.engine, "read_some", read_some)


def test_a_cold_get_tuple_reads_the_head_cache_not_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EventStoreSaver(tmp_path) as saver:  # a writer that never reads
        last = _chain(saver, "t", 60)
    log = SessionPaths(tmp_path, "langgraph-t").log
    cache = cache_path(tmp_path, "langgraph-t", "langgraph_head")
    assert log.stat().st_size > 100_000 and cache.stat().st_size < 10_000
    assert not cache_path(tmp_path, "langgraph-t", "langgraph").exists()  # no second copy
    with EventStoreSaver(tmp_path) as saver:
        spy = _ReadSpy(saver.store, monkeypatch)
        got = saver.get_tuple(_latest("t", ""))
        assert spy.read == 0  # the cache is at the head: no log byte read
        assert "langgraph" not in saver.store.cache_info("langgraph-t").folds
        assert checkpoint_summary(got) == checkpoint_summary(
            _full_latest(saver, "t", "")
        )  # now folded
        assert got is not None and got.config == last
        assert got.checkpoint["channel_values"]["k"] == "kept"  # a blob from checkpoint 0
        # another append, by another saver: the next cold read folds only that line
        other = EventStoreSaver(tmp_path)
        other.put_writes(last, [("v", "late")], "task-late")
        other.close()
        before = spy.read
        got = saver.get_tuple(_latest("t", ""))
        assert got is not None and ("task-late", "v", "late") in (got.pending_writes or [])
        assert 0 < spy.read - before < 1000


def test_a_head_cache_an_earlier_version_wrote_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # earlier versions kept the head state in its cache as JSON (`encode_state`)
    with monkeypatch.context() as m:
        m.setattr(
            lg.LangGraphHeadProjection, "encode_cache", lg.LangGraphHeadProjection.encode_state
        )
        with EventStoreSaver(tmp_path) as saver:
            last = _chain(saver, "t", 30)
    json_cache = cache_path(tmp_path, "langgraph-t", "langgraph_head").read_bytes()
    with EventStoreSaver(tmp_path) as saver:
        spy = _ReadSpy(saver.store, monkeypatch)
        got = saver.get_tuple(_latest("t", ""))
        assert spy.read == 0  # the JSON cache is used, not refolded from the log
        assert got is not None and got.config == last
        assert checkpoint_summary(got) == checkpoint_summary(_full_latest(saver, "t", ""))
        saver.put_writes(last, [("v", "new")], "task-new")
    # the writer's close kept the head's cache in this version's encoding, a third smaller
    assert len(cache_path(tmp_path, "langgraph-t", "langgraph_head").read_bytes()) < len(json_cache)
    with EventStoreSaver(tmp_path) as saver:
        spy = _ReadSpy(saver.store, monkeypatch)
        got = saver.get_tuple(_latest("t", ""))
        assert spy.read == 0 and got is not None
        assert ("task-new", "v", "new") in (got.pending_writes or [])


class _HeadKeepingParents(lg.LangGraphHeadProjection):
    """The head projection as the release before `unparented` folded it (version 1): a
    prune's kept checkpoint keeps its parent."""

    version = 1

    def apply(self, state: Any, event: Any) -> Any:
        if isinstance(event, CheckpointsRemoved):
            event = msgspec.structs.replace(event, unparented=[])
        return super().apply(state, event)


def _parent_of_head(heads: Any) -> str | None:
    head = heads[""].head
    assert head is not None
    return head.checkpoint.parent_id  # type: ignore[no-any-return]


def test_a_head_cache_of_the_release_that_kept_parents_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a fold cache saved by the release whose head kept a pruned checkpoint's
    parent (same projection version) was used by this one, whose head has none.
    The head's version is 2 now: neither release uses the other's cache."""
    monkeypatch.setattr(
        eventstore.core.tuning, "DEFAULT_TUNING", eventstore.core.tuning.Tuning(cache_on_close=0)
    )  # every close leaves its caches
    with EventStoreSaver(tmp_path) as saver:
        _chain(saver, "t", 5)
        # a prune killed before its compaction: its removal, naming the kept checkpoint
        # in `unparented`, stays in the live log, where each release folds it its way
        monkeypatch.setattr(saver.store, "compact", lambda *args, **kwargs: None)
        saver.prune(["t"])
    cache = cache_path(tmp_path, "langgraph-t", "langgraph_head")

    def old_release_parent() -> str | None:
        with SessionStore(tmp_path) as old:
            old.learn(lg.EVENT_TYPES, [_HeadKeepingParents()])
            parent = _parent_of_head(old.load("langgraph-t", "langgraph_head"))
        assert cache.exists()  # its close saved its fold
        return parent

    assert old_release_parent() is not None
    with EventStoreSaver(tmp_path) as saver:
        got = saver.get_tuple(_latest("t", ""))
        assert got is not None and got.parent_config is None
        assert _parent_of_head(saver.store.load("langgraph-t", "langgraph_head")) is None
    # and the other way: the old release folds its own state, not this one's cache
    assert old_release_parent() is not None


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]
    turns: int


def reply(s: Chat) -> dict[str, Any]:
    return {"messages": [f"reply {len(s['messages'])}"], "turns": s.get("turns", 0) + 1}


def test_a_graph_keeps_its_heads_known(tmp_path: Path) -> None:
    """A linear run (each checkpoint the child of the newest) never leaves the head
    unknown: every get_tuple of the latest is served by the head projection."""
    g: Any = StateGraph(Chat)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    cfg: Any = {"configurable": {"thread_id": "chat"}}
    with EventStoreSaver(tmp_path) as saver:
        graph = g.compile(checkpointer=saver)
        for i in range(5):
            graph.invoke({"messages": [f"ask {i}"]}, cfg)
            heads = saver._heads("chat")
            assert heads is not None and heads[""].head is not None
        assert "langgraph" not in saver.store.cache_info("langgraph-chat").folds
        values = graph.get_state(cfg).values
    with EventStoreSaver(tmp_path) as saver:
        assert g.compile(checkpointer=saver).get_state(cfg).values == values
        assert values["turns"] == 5 and len(values["messages"]) == 10


def test_a_new_process_reads_what_this_one_wrote(tmp_path: Path) -> None:
    with EventStoreSaver(tmp_path) as saver:
        _chain(saver, "t", 40)
        tup = saver.get_tuple(_latest("t", ""))
        assert tup is not None
    code = (
        "import json, sys\n"
        "from eventstore.integrations.langgraph import EventStoreSaver\n"
        "with EventStoreSaver(sys.argv[1]) as s:\n"
        "    t = s.get_tuple({'configurable': {'thread_id': 't', 'checkpoint_ns': ''}})\n"
        "    print(json.dumps([t.config, t.checkpoint['channel_values'],"
        " [list(w) for w in t.pending_writes]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    config, values, writes = json.loads(out)
    assert config == tup.config
    assert values == tup.checkpoint["channel_values"]
    assert writes == [list(w) for w in tup.pending_writes or []]


# -- a cache that does not check is ignored ---------------------------------------------


def _cold_answer(root: Path) -> Any:
    with EventStoreSaver(root) as saver:
        return checkpoint_summary(saver.get_tuple(_latest("t", "")))


def _damage_cases(cache: Path, other: Path) -> list[tuple[str, bytes]]:
    data = cache.read_bytes()
    nl = data.find(b"\n")
    cases = [
        ("empty", b""),
        ("truncated", data[: len(data) // 2]),
        ("no newline", data[:-1]),
        ("another thread's", other.read_bytes()),
        ("garbage", b"not a cache\n" * 10),
    ]
    for at in (1, nl + 5, len(data) // 2, len(data) - 10):
        flipped = bytearray(data)
        flipped[at] ^= 0x20
        cases.append((f"byte {at} flipped", bytes(flipped)))
    return cases


def test_a_damaged_head_cache_is_ignored(tmp_path: Path) -> None:
    with EventStoreSaver(tmp_path) as saver:
        _chain(saver, "t", 40)
        _chain(saver, "u", 45)
    cache = cache_path(tmp_path, "langgraph-t", "langgraph_head")
    other = cache_path(tmp_path, "langgraph-u", "langgraph_head")
    good = cache.read_bytes()
    truth = _cold_answer(tmp_path)
    assert truth is not None
    for what, damaged in _damage_cases(cache, other):
        cache.write_bytes(damaged)
        assert _cold_answer(tmp_path) == truth, what
        cache.write_bytes(good)
    # a cache whose state was altered so that it still decodes (a blob's serde type
    # renamed, in whichever encoding the cache keeps it) is caught by its checksum
    state_hacked = good.replace(b"msgpack", b"msgpacK", 1)
    assert state_hacked != good
    cache.write_bytes(state_hacked)
    assert _cold_answer(tmp_path) == truth


def test_a_stale_but_genuine_cache_is_caught_up(tmp_path: Path) -> None:
    with EventStoreSaver(tmp_path) as saver:
        cfg = _chain(saver, "t", 40)
    cache = cache_path(tmp_path, "langgraph-t", "langgraph_head")
    old = cache.read_bytes()
    with EventStoreSaver(tmp_path) as saver:
        cp = empty_checkpoint()
        cp["channel_versions"] = {"v": "2" * 32 + ".1"}
        cp["channel_values"] = {"v": "newest"}
        saver.put(cfg, cp, {"source": "loop", "step": 99}, {"v": "2" * 32 + ".1"})
        truth = checkpoint_summary(saver.get_tuple(_latest("t", "")))
    cache.write_bytes(old)  # the cache of the log as it was before that put
    assert _cold_answer(tmp_path) == truth
    assert truth[2] == {"v": "newest"}


# -- logs written before the head projection existed ------------------------------------


def test_a_snapshot_without_the_head_state_falls_back_to_the_full_index(tmp_path: Path) -> None:
    old_style = SessionStore(
        tmp_path, event_types=lg.EVENT_TYPES, projections=(lg.PROJECTION,)
    )  # as the saver registered its projections before the head existed
    with EventStoreSaver(tmp_path) as writer:
        cfg = _chain(writer, "t", 5, size=10)
    old_style.compact("langgraph-t", archive=False, force=True)  # a snapshot of "langgraph" only
    old_style.close()
    with EventStoreSaver(tmp_path) as saver:
        tup = saver.get_tuple(_latest("t", ""))
        assert tup is not None and tup.config == cfg
        assert tup.checkpoint["channel_values"] == {"v": "4:" + "x" * 10, "k": "kept"}
        assert saver.session_id("t") not in saver._no_head  # derived from the old snapshot
        cp = empty_checkpoint()  # writes still work, and read back
        cp["channel_versions"] = {"v": "3" * 32}
        cp["channel_values"] = {"v": "after"}
        saver.put(cfg, cp, {"source": "loop", "step": 9}, {"v": "3" * 32})
        again = saver.get_tuple(_latest("t", ""))
        assert again is not None and again.checkpoint["channel_values"]["v"] == "after"
        assert len(list(saver.list(_latest("t", "")))) == 6
        assert saver.store.verify("langgraph-t").ok
        # and it compacts again: the head's state is derived from the old snapshot's index
        saver.prune(["t"])
        assert len(list(saver.list(_latest("t", "")))) == 1
        newest = saver.get_tuple(_latest("t", ""))
        assert newest is not None and newest.checkpoint["channel_values"]["v"] == "after"
        assert saver.store.verify("langgraph-t").ok
    with EventStoreSaver(tmp_path) as cold:  # a new process: from the fold cache
        newest = cold.get_tuple(_latest("t", ""))
        assert newest is not None and newest.checkpoint["channel_values"]["v"] == "after"


def test_the_head_derived_from_an_index_is_the_head_folded(tmp_path: Path) -> None:
    """For logs the saver wrote, the head derived from a snapshot's index answers as the
    head folded from the events (one thread with namespaces, writes and removals)."""
    from eventstore.format.events import Snapshot

    with EventStoreSaver(tmp_path) as saver:
        _chain(saver, "t", 6, size=10)
        sid = saver.session_id("t")
        saver.store.compact(sid, archive=True, force=True)
        live = saver.store.engine.read(sid, None)  # the snapshot opens the live log
        snap = saver.store.codec.decode_line(live.data.split(b"\n", 1)[0], 0, live.where)
        assert isinstance(snap, Snapshot)
        folded = saver.store.load(sid, lg.HEAD_PROJECTION)
    derived = lg.HEAD_PROJECTION.state_from_snapshot(snap)
    assert derived is not None
    assert {ns: h.head for ns, h in derived.items()} == {ns: h.head for ns, h in folded.items()}


def test_saver_entries_and_events_are_not_tracked_by_the_gc(tmp_path: Path) -> None:
    """A cold fold decodes thousands of them: tracked, they trigger the cyclic GC,
    whose first full pass in a fresh process cost more than the fold itself."""
    with EventStoreSaver(tmp_path) as saver:
        _chain(saver, "t", 4, size=10)
        events = list(saver.store.read_events("langgraph-t"))
        full = saver._state("t")
        heads = saver._heads("t")
    assert events and full and heads
    objects: list[Any] = [*events, *full.values(), *heads.values()]
    objects += [h.head for h in heads.values() if h.head is not None]
    objects += [e.checkpoint for e in full.values() if isinstance(e, CheckpointEntry)]
    assert not any(gc.is_tracked(o) for o in objects)
    assert {type(o).__name__ for o in objects} >= {
        "CheckpointPut",
        "WritesPut",
        "CheckpointEntry",
        "BlobEntry",
        "WritesEntry",
        "NewestEntry",
        "NamespaceHead",
        "HeadEntry",
        "TypedValue",
    }
    # and the head state round-trips through its encoding (what the cache holds)
    proj = lg.HEAD_PROJECTION
    assert proj.decode_state(proj.encode_state(heads)) == heads
    assert isinstance(next(iter(heads.values())), NamespaceHead)
    assert msgspec.json.decode(proj.encode_state(heads))  # plain JSON
    assert all(
        isinstance(b, BlobEntry) for h in heads.values() if h.head for b in h.head.blobs.values()
    )
    assert all(isinstance(h.head.writes, WritesEntry | None) for h in heads.values() if h.head)
