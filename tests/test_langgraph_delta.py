"""LangGraph channel blobs stored as deltas (`EventStoreSaver(delta_blobs=True)`, the
default): a graph's log grows linearly with its steps; every read answers as LangGraph's
InMemorySaver and as a saver storing every blob whole do, whatever the calls and
whichever of two stores on one root wrote last; a log written before deltas reads as
it did; a delta whose base is not the blob it was made against is a typed error; an
older release reading a delta fails instead of returning a wrong value.
"""

from __future__ import annotations

import base64
import json
import pickle
import shutil
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import ormsgpack
import pytest
from conftest import checkpoint_summary
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from eventstore import CorruptLogError, SessionStore
from eventstore.engines.file.layout import SessionPaths
from eventstore.integrations import langgraph as lg
from eventstore.integrations.langgraph import EventStoreSaver
from eventstore.integrations.langgraph_delta import (
    CHAIN_MAX,
    SAMPLE,
    WINDOW,
    BlobDelta,
    DeltaChain,
    delta_of,
    sample_crc,
    whole_at,
)
from eventstore.integrations.langgraph_state import (
    STAND_IN,
    BlobEntry,
    BlobPut,
    CheckpointPut,
    CheckpointsRemoved,
    ThreadCopied,
    TypedValue,
    against_head,
    whole_blob,
    whole_entries,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "langgraph"


def _store(root: Path | str) -> SessionStore:
    return SessionStore(root, event_types=lg.EVENT_TYPES, projections=lg.PROJECTIONS)


def _blob_puts(store: SessionStore, sid: str) -> list[BlobPut]:
    return [b for e in store.read_events(sid) if isinstance(e, CheckpointPut) for b in e.blobs]


# -- the delta itself ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.binary(min_size=0, max_size=600),
    st.integers(0, 20),
    st.binary(max_size=6),
    st.binary(max_size=300),
    st.binary(max_size=600),
)
def test_a_delta_rebuilds_its_value_over_its_base_only(
    base: bytes, at: int, header: bytes, tail: bytes, other: bytes
) -> None:
    """A value that is its base with a few bytes changed near the start and bytes added
    at the end (as msgpack writes a grown list), or any bytes at all: if a delta is made,
    applying it over the base gives the value, and over any other bytes gives None."""
    grown = base[:at] + header + base[at + len(header) :] + tail
    for value in (grown, other):
        delta = delta_of("msgpack", value, '"v2"', '"v1"', "msgpack", base)
        if delta is None:
            continue
        assert delta.applied("msgpack", base) == value
        assert len(delta.head) + len(delta.tail) < len(value) / 2
        assert delta.applied("json", base) is None
        if other != base:
            assert delta.applied("msgpack", other) is None
    if len(base) >= 300 and len(tail) < 100 and len(grown) >= len(base):
        assert delta_of("msgpack", grown, '"v2"', '"v1"', "msgpack", base) is not None


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        # a root longer than the CRC's first sample: read from the root alone
        st.tuples(st.binary(min_size=1, max_size=16), st.integers(SAMPLE - 8, 3 * SAMPLE)).map(
            lambda t: (t[0] * t[1])[: t[1]]
        ),
    ),
    st.lists(
        st.tuples(
            st.binary(max_size=WINDOW + 6),
            st.one_of(st.binary(max_size=100), st.integers(0, 6000).map(lambda n: b"t" * n)),
        ),
        min_size=1,
        max_size=3 * CHAIN_MAX,
    ),
)
def test_a_chain_of_deltas_reads_as_the_deltas_applied_in_turn(
    root: bytes, steps: list[tuple[bytes, bytes]]
) -> None:
    """Any deltas (heads longer than the window a chain keeps or than their base, tails
    over a short base inside the window, values past the CRC's samples, roots shorter
    and longer than a sample), each linked
    over the value before (`BlobDelta.linked`): the value and its sample CRC are those
    of the deltas applied whole in turn; over another type or bytes it is refused, as
    `applied` refuses."""
    value: bytes = root
    node: bytes | DeltaChain = root
    for head, tail in steps:
        delta = BlobDelta("msgpack", '"v"', len(value), sample_crc(value), head, tail)
        other = value[:-1] + bytes([value[-1] ^ 1]) if value else b"?"  # its last byte
        value = head + value[len(head) :] + tail
        linked = delta.linked("msgpack", node)
        assert linked is not None and delta.linked("json", node) is None
        assert delta.linked("msgpack", other) is None
        got = linked if isinstance(linked, bytes) else linked.whole()
        assert got == value
        if isinstance(linked, DeltaChain):
            assert linked.sample_crc() == sample_crc(value) and linked.length == len(value)
            assert linked.depth <= CHAIN_MAX
        node = linked


# -- the projections: deltas change no state, whatever the events ---------------------------

_BODY = b"b" * 400
# a msgpack-like blob: a header byte (a count), an unchanged body, then chunks appended
_BLOBS = st.builds(
    lambda head, chunks: TypedValue("msgpack", bytes([head]) + _BODY + b"".join(chunks)),
    st.integers(0x91, 0x94),
    st.lists(st.sampled_from([b"p" * 120, b"q" * 120]), max_size=3),
)
_IDS = st.sampled_from(["00", "03", "06"])
# "4": a power of two, stored whole (`whole_at`); "3" and "5" may be deltas
_NSS, _VERSIONS = st.sampled_from(["", "n"]), st.sampled_from("345")


@st.composite
def _saver_events(draw: Any, copies: bool = True) -> list[Any]:
    """Events as a saver writes them, with whole blobs: puts, removals, copies."""
    out: list[Any] = []
    for i in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["put", "put", "put", "removed", "copied"]))
        if kind == "put":
            versions = draw(st.dictionaries(st.sampled_from("ab"), _VERSIONS, min_size=1))
            # mostly a blob for each channel at the version named (the simplest draw),
            # sometimes none (the version's blob was put before) or another version's
            blobs = [
                BlobPut(ch, v if pick == 0 else draw(_VERSIONS), draw(st.one_of(_BLOBS, st.none())))
                for ch, v in versions.items()
                if (pick := draw(st.integers(0, 3))) < 3
            ]
            out.append(
                CheckpointPut(
                    ns=draw(_NSS),
                    # mostly a newer id than any before (a graph's loop), else one of a
                    # few (older, or put again)
                    checkpoint_id=f"{i:02}" if draw(st.integers(0, 3)) < 3 else draw(_IDS),
                    versions=versions,
                    checkpoint=TypedValue("msgpack", b"c"),
                    metadata=TypedValue("msgpack", b"m"),
                    blobs=blobs,
                )
            )
        elif kind == "removed":
            pairs = draw(st.lists(st.tuples(_NSS, _IDS), min_size=1, max_size=3))
            out.append(CheckpointsRemoved(checkpoints=pairs, reason="test"))
        elif copies:
            source = lg.PROJECTION.initial()
            for ev in draw(_saver_events(copies=False)):
                source = lg.PROJECTION.apply(source, ev)
            out.append(ThreadCopied(source_thread_id="other", entries=dict(source)))
    return out


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(_saver_events())
def test_deltas_made_against_the_head_change_no_state_of_either_projection(
    events: list[Any],
) -> None:
    """Each put's blobs turned into deltas against the head state it would be appended
    at (as `put` does): both projections fold to exactly the states of the whole blobs,
    after every event, whatever came before (removals, copies, forks onto older ids,
    versions put again); the full index's linked blobs read whole (`whole_entries`) and
    encode (snapshots) as the whole ones. So the base a delta names is in the full index
    whenever the head held it, with the same bytes."""
    whole = (lg.PROJECTION.initial(), lg.HEAD_PROJECTION.initial())
    delta = (lg.PROJECTION.initial(), lg.HEAD_PROJECTION.initial())
    made = 0
    for ev in events:
        whole = (lg.PROJECTION.apply(whole[0], ev), lg.HEAD_PROJECTION.apply(whole[1], ev))
        if isinstance(ev, CheckpointPut):
            blobs = against_head(ev.blobs, delta[1].get(ev.ns))
            made += sum(b.delta is not None for b in blobs)
            ev = msgspec.structs.replace(ev, blobs=blobs)
        delta = (lg.PROJECTION.apply(delta[0], ev), lg.HEAD_PROJECTION.apply(delta[1], ev))
        assert whole_entries(delta[0]) == whole[0] and delta[1] == whole[1]
        assert lg.PROJECTION.encode_state(delta[0]) == lg.PROJECTION.encode_state(whole[0])
    target(float(made))


# -- the full index keeps a delta linked to its base ----------------------------------------

_SERDE = JsonPlusSerializer()


@st.composite
def _long_chain(draw: Any) -> list[Any]:
    """Hundreds of puts of one channel (more than `CHAIN_MAX` links several times), as
    a graph's loop makes them: its list grown by items of any size, sometimes rewritten
    (a new whole blob), older checkpoints sometimes removed (the keys of a chain's
    bases), the thread sometimes copied into itself (its blobs whole again)."""
    items: list[str] = []
    events: list[Any] = []
    n = draw(st.integers(2 * CHAIN_MAX, 5 * CHAIN_MAX))
    at = st.dictionaries(st.integers(0, n), st.sampled_from(["rewrite", "remove", "copy"]))
    ops = draw(at.filter(lambda d: len(d) <= 6))
    for i in range(n):
        op = ops.get(i, "grow")
        if op == "remove" and i > 2:
            gone = draw(st.lists(st.integers(0, i - 2), min_size=1, max_size=3))
            events.append(
                CheckpointsRemoved(checkpoints=[("", f"{g:04}") for g in gone], reason="t")
            )
        elif op == "copy":
            events.append(("copy",))
        if op == "rewrite":
            items = draw(st.lists(WORDS, max_size=3))
        items = [*items, "x" * draw(st.integers(0, 9000 if i % 50 == 0 else 300))]
        events.append(
            CheckpointPut(
                ns="",
                checkpoint_id=f"{i:04}",
                versions={"m": f'"{i}"'},
                checkpoint=TypedValue("msgpack", b"c"),
                metadata=TypedValue("msgpack", b"m"),
                blobs=[BlobPut("m", f'"{i}"', TypedValue(*_SERDE.dumps_typed(items)))],
            )
        )
    return events


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_long_chain())
def test_long_chains_of_linked_blobs_read_and_encode_as_whole_blobs(events: list[Any]) -> None:
    """Hundreds of deltas folded into the full index: every version reads whole as the
    fold of the same puts with whole blobs holds it (`whole_blob`, `whole_entries`), the
    state encodes (snapshots) to the same bytes and decodes back to them, and most blobs
    are linked, not copied: one whole blob per `CHAIN_MAX` links at most."""
    whole, delta = lg.PROJECTION.initial(), lg.PROJECTION.initial()
    head = lg.HEAD_PROJECTION.initial()
    deltas = 0
    for ev in events:
        if isinstance(ev, tuple):  # the thread copied into itself: every entry whole
            ev = ThreadCopied(source_thread_id="self", entries=whole_entries(delta))
        whole = lg.PROJECTION.apply(whole, ev)
        if isinstance(ev, CheckpointPut):
            ev = msgspec.structs.replace(ev, blobs=against_head(ev.blobs, head.get(ev.ns)))
            deltas += sum(b.delta is not None for b in ev.blobs)
        delta, head = lg.PROJECTION.apply(delta, ev), lg.HEAD_PROJECTION.apply(head, ev)
    assert {k: whole_blob(e) for k, e in delta.items() if k.startswith("b")} == {
        k: e for k, e in whole.items() if k.startswith("b")
    }
    assert whole_entries(delta) == whole
    encoded = lg.PROJECTION.encode_state(delta)
    assert encoded == lg.PROJECTION.encode_state(whole)
    assert lg.PROJECTION.decode_state(encoded) == whole
    linked = [e for e in delta.values() if isinstance(e, DeltaChain)]
    assert all(e.depth <= CHAIN_MAX for e in linked)
    if not any(isinstance(ev, tuple | CheckpointsRemoved) for ev in events):
        # every version still held: each delta linked, but one in CHAIN_MAX + 1 kept whole
        assert deltas - deltas // CHAIN_MAX <= len(linked) <= deltas
    target(float(deltas))


def _items_put(saver: EventStoreSaver, cfg: Any, cp: Any, items: list[str], step: int) -> Any:
    cp["channel_values"] = {"m": items}
    cp["channel_versions"] = {"m": f"{step:032}.1"}
    return saver.put(cfg, cp, {"source": "loop", "step": step}, {"m": f"{step:032}.1"})


def _long_thread(savers: list[EventStoreSaver], steps: int) -> list[Any]:
    """The same puts to each saver (a message list grown each step, once a fork from an
    older checkpoint, pending writes on some), so their full indexes hold the same
    checkpoints; the configs put, in order."""
    put: list[Any] = []
    items: list[str] = []
    for step in range(steps):
        parent = put[-1] if put else {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        if step == steps // 3:
            parent = put[step // 2]  # a fork: stored whole, a chain starts over it
        items = [*items, f"{step}:" + "w" * (100 + step % 300)]
        cp = empty_checkpoint()
        got = [_items_put(saver, parent, dict(cp), items, step) for saver in savers]
        assert all(g == got[0] for g in got)
        if step % 7 == 0:
            for saver in savers:
                saver.put_writes(got[0], [("m", f"w{step}")], "task")
        put.append(got[0])
    return put


def _index(saver: EventStoreSaver, thread: str) -> bytes:
    """The encoding of a thread's full index (what a snapshot stores of it)."""
    return lg.PROJECTION.encode_state(saver.store.load(saver.session_id(thread), lg.PROJECTION))


def _reads(saver: EventStoreSaver, thread: str, named: list[Any]) -> Any:
    cfg: Any = {"configurable": {"thread_id": thread}}
    listed = [checkpoint_summary(t) for t in saver.list(cfg)]
    got = []
    for c in named:
        conf = {**c["configurable"], "thread_id": thread}
        got.append(checkpoint_summary(saver.get_tuple({"configurable": conf})))
    return listed, got


def test_a_long_thread_of_linked_blobs_reads_as_whole_blobs_through_every_call(
    tmp_path: Path,
) -> None:
    """300 puts (chains longer than `CHAIN_MAX`, a fork) to a delta saver and to one storing
    every blob whole: `list`, `get_tuple` of named older checkpoints, the full index's
    encoding, then `copy_thread`, a compaction (its snapshot holds whole blobs, a new
    process reads it, with every blob whole, as a copy does) and `prune` all answer the
    same on both."""
    ours, ref = (
        EventStoreSaver(tmp_path / "delta"),
        EventStoreSaver(tmp_path / "whole", delta_blobs=False),
    )
    put = _long_thread([ours, ref], 2 * CHAIN_MAX + 50)
    named = put[::23] + put[-3:]
    index = ours.store.load("langgraph-t", lg.PROJECTION)
    assert sum(isinstance(e, DeltaChain) for e in index.values()) > len(put) * 0.9
    for thread in ("t", "copy"):
        assert _reads(ours, thread, named) == _reads(ref, thread, named)
        assert _index(ours, thread) == _index(ref, thread)
        if thread == "t":
            for saver in (ours, ref):
                saver.copy_thread("t", "copy")
    ours.store.compact("langgraph-t", force=True)
    with EventStoreSaver(tmp_path / "delta") as cold:
        assert _reads(cold, "t", named) == _reads(ref, "t", named)
        assert _index(cold, "t") == _index(ref, "t")
        # a snapshot and a copy's event carry whole blobs: folded from them, whole again
        for thread in ("t", "copy"):
            index = cold.store.load(cold.session_id(thread), lg.PROJECTION)
            assert not any(isinstance(e, DeltaChain) for e in index.values())
    for saver in (ours, ref):
        saver.prune(["t"])
    assert _reads(ours, "t", named) == _reads(ref, "t", named)
    assert _index(ours, "t") == _index(ref, "t")
    assert ours.store.verify("langgraph-t").ok and ours.store.verify("langgraph-copy").ok
    ours.close()
    ref.close()


# -- a graph's log: linear in its steps ---------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: int


def _reply(s: Chat) -> dict[str, Any]:
    n = len(s["messages"])
    return {"messages": [AIMessage("a" * 300, id=f"ai-{n}")], "turns": s["turns"] + 1}


def _chat(saver: Any) -> Any:
    g = StateGraph(Chat)
    g.add_node("reply", _reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=saver)


def _run(graph: Any, cfg: Any, turns: range) -> None:
    for i in turns:
        graph.invoke({"messages": [HumanMessage("q" * 300, id=f"h-{i}")], "turns": i}, cfg)


def test_a_blob_is_stored_whole_at_every_power_of_two_of_its_version(tmp_path: Path) -> None:
    """So a value read from the log needs fewer deltas than half its versions; the
    other versions of a grown list are deltas."""
    with EventStoreSaver(tmp_path) as saver:
        cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        items: list[str] = []
        for step in range(1, 41):
            items = [*items, f"{step}:" + "w" * 300]
            cfg = _items_put(saver, cfg, empty_checkpoint(), items, step)
        puts = _blob_puts(saver.store, "langgraph-t")
    whole = [int(b.version.strip('"').split(".")[0]) for b in puts if b.delta is None]
    assert whole == [1, 2, 4, 8, 16, 32] and len(puts) == 40
    assert all(whole_at(f'"{n:032}.1"') == (n in whole) for n in range(1, 41))
    assert not any(whole_at(v) for v in ['"v1"', '"3.5"', "6", '""', '"1e9"', "-4"])


def test_a_graph_log_grows_linearly_and_holds_far_fewer_bytes_than_its_blobs(
    tmp_path: Path,
) -> None:
    cfg: Any = {"configurable": {"thread_id": "chat"}}
    log = SessionPaths(tmp_path, "langgraph-chat").log
    ref = _chat(InMemorySaver())
    with EventStoreSaver(tmp_path) as saver:
        graph = _chat(saver)
        _run(graph, cfg, range(25))  # 50 steps: 25 turns of a put for the input, one after
        half = log.stat().st_size
        _run(graph, cfg, range(25, 50))
        size = log.stat().st_size
        _run(ref, cfg, range(50))
        history = [(s.values, s.next, s.metadata) for s in graph.get_state_history(cfg)]
        assert history == [(s.values, s.next, s.metadata) for s in ref.get_state_history(cfg)]
        index = saver.store.load("langgraph-chat", lg.PROJECTION)
        blobs = _blob_puts(saver.store, "langgraph-chat")
    whole = sum(
        len(b.value.data)
        for b in whole_entries(index).values()
        if isinstance(b, BlobEntry) and b.value
    )
    assert len(history) > 100 and any(b.delta is not None for b in blobs)
    # quadratic growth would make the second half about three times the first
    assert size - half < 1.3 * half
    assert size * 4 < whole  # the index holds every blob whole; the log a fraction
    with EventStoreSaver(tmp_path) as cold:  # a new process reads the same
        assert [(s.values, s.next, s.metadata) for s in _chat(cold).get_state_history(cfg)] == (
            history
        )
    assert _store(tmp_path).verify("langgraph-chat").ok


# -- any calls, two stores on one root: as InMemorySaver and as whole blobs answer -----------

THREADS = ["t1", "t2"]
NAMESPACES = ["", "sub"]
WORDS = st.integers(0, 40).map(lambda n: "w" * (100 + n))


class _Twins:
    """The same calls to a delta saver (`ours`, or `other`: its own store on the same
    root, as another process), a saver storing blobs whole on another root, and, while
    only the calls it has were made, InMemorySaver."""

    def __init__(self, root: Path, whole_root: Path, data: st.DataObject) -> None:
        self.data = data
        self.ours = EventStoreSaver(root)
        self.other = EventStoreSaver(_store(root))
        self.whole = EventStoreSaver(whole_root, delta_blobs=False)
        self.ref: InMemorySaver | None = InMemorySaver()
        self.stored: list[Any] = []
        self.n = 0

    def close(self) -> None:
        for saver in (self.ours, self.other, self.whole):
            saver.close()
        self.other.store.close()

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    def put(self) -> None:
        thread, ns = self.draw(st.sampled_from(THREADS)), self.draw(st.sampled_from(NAMESPACES))
        latest: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        here = [c for c in self.stored if c["configurable"]["thread_id"] == thread
                and c["configurable"]["checkpoint_ns"] == ns]  # fmt: skip
        # mostly the newest, as a graph's loop puts; else a fork, or a new root
        # (the simplest draw is the commonest case: hypothesis draws it most)
        parent = here[-1] if here else None
        if self.draw(st.integers(0, 4)) == 4:
            parent = self.draw(st.sampled_from([None, *here]))
        base = self.whole.get_tuple(parent or latest)
        values = dict(base.checkpoint["channel_values"]) if base else {}
        versions = dict(base.checkpoint["channel_versions"]) if base else {}
        new: dict[str, Any] = {}
        for ch in self.draw(st.sets(st.sampled_from("mk"), min_size=1, max_size=2)):
            # mostly a list grown at its end, as a graph's
            grown = self.draw(st.integers(0, 4)) < 4
            kept = values.get(ch, []) if grown else self.draw(st.lists(WORDS, max_size=6))
            values[ch] = [*kept, self.draw(WORDS)]
            self.n += 1
            new[ch] = f"{self.n:032}.{self.draw(st.integers(0, 9))}"
        cp = empty_checkpoint()
        cp["channel_values"] = {ch: values[ch] for ch in new}
        cp["channel_versions"] = {**versions, **new}
        cfg: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        if parent is not None:
            cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        metadata: Any = {"source": "loop", "step": self.n, "run_id": f"run-{self.n % 3}"}
        writer = self.draw(st.sampled_from([self.ours, self.other]))
        got = writer.put(cfg, cp, metadata, dict(new))
        assert got == self.whole.put(cfg, cp, metadata, dict(new))
        if self.ref is not None:
            assert got == self.ref.put(cfg, cp, metadata, dict(new))
        self.stored.append(got)

    def step(self, extended: bool) -> None:
        ops = ["put", "put", "put", "writes", "delete", "compact"]
        op = self.draw(st.sampled_from([*ops, "copy", "runs", "prune"] if extended else ops))
        thread = self.draw(st.sampled_from(THREADS))
        if op == "put":
            self.put()
        elif op == "writes" and self.stored:
            target = self.draw(st.sampled_from(self.stored))
            writes = self.draw(st.lists(st.tuples(st.sampled_from("xy"), WORDS), max_size=2))
            for saver in (self.ours, self.whole, self.ref):
                if saver is not None:
                    saver.put_writes(target, writes, "task", "")
        elif op == "delete":
            for saver in (self.ours, self.whole, self.ref):
                if saver is not None:
                    saver.delete_thread(thread)
            for saver in (self.ours, self.whole):  # the id, used again (a tombstone otherwise)
                saver.store.restore(saver.session_id(thread))
            self.stored = [c for c in self.stored if c["configurable"]["thread_id"] != thread]
        elif op in ("copy", "runs", "prune"):
            self.ref = None  # calls InMemorySaver does not have
            target, run = self.draw(st.sampled_from(THREADS)), self.draw(st.integers(0, 2))
            for saver in (self.ours, self.whole):
                if op == "copy":
                    saver.copy_thread(thread, target)
                elif op == "runs":
                    saver.delete_for_runs([f"run-{run}"])
                else:
                    saver.prune([thread])
            self.stored = [c for c in self.stored if self.whole.get_tuple(c) is not None]
        elif op == "compact" and self.ours.session_id(thread) in self.ours.store.list_sessions():
            self.ours.store.compact(self.ours.session_id(thread), force=True)

    def check(self, saver: EventStoreSaver) -> None:
        cfgs = [{"configurable": {"thread_id": t, "checkpoint_ns": ns}}
                for t in THREADS for ns in NAMESPACES] + self.stored  # fmt: skip
        for refs in (self.whole, self.ref):
            if refs is not None:
                for cfg in cfgs:
                    got = checkpoint_summary(saver.get_tuple(cfg))
                    assert got == checkpoint_summary(refs.get_tuple(cfg)), cfg
                listed = sorted((checkpoint_summary(t) for t in saver.list(None)), key=repr)
                assert listed == sorted((checkpoint_summary(t) for t in refs.list(None)), key=repr)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_calls_from_two_stores_read_as_in_memory_and_whole_blobs_do(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    root = tmp_path_factory.mktemp("delta")
    twins = _Twins(root, tmp_path_factory.mktemp("whole"), data)
    try:
        extended = data.draw(st.booleans())  # else only calls InMemorySaver has too
        for _ in range(data.draw(st.integers(1, 30))):
            twins.step(extended)
            twins.check(twins.ours)
        twins.check(twins.other)
        with EventStoreSaver(root) as cold:  # a new process: the fold caches, the logs
            twins.check(cold)
        with _store(root) as store:
            assert all(store.verify(sid).ok for sid in store.list_sessions())
            deltas = [b for sid in store.list_sessions() for b in _blob_puts(store, sid)]
        target(float(sum(b.delta is not None for b in deltas)))  # search towards many
    finally:
        twins.close()


def _grown(saver: EventStoreSaver, cfg: Any, items: list[str], version: str) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = {"m": items}
    cp["channel_versions"] = {"m": version}
    return saver.put(cfg, cp, {"source": "loop", "step": 0}, {"m": version})


def test_a_delta_judged_on_a_stale_head_is_judged_again_on_the_moved_one(url: str) -> None:
    """Store A's head state is stale (B put after A's last put): A's delta is made
    against B's blob, the head the append commits at, and every saver reads it exact;
    on every engine."""
    cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    items = ["m" * 200 for _ in range(10)]
    with _store(url) as store_a, _store(url) as store_b, EventStoreSaver(url) as cold:
        a, b = EventStoreSaver(store_a), EventStoreSaver(store_b)
        first = _grown(a, cfg, items, "1")
        # (odd versions: a power of two's blob is whole, `whole_at`)
        second = _grown(b, first, [*items, "from b"], "3")
        _grown(a, second, [*items, "from b", "from a"], "5")
        last = _blob_puts(store_a, "langgraph-t")[-1]
        assert last.delta is not None and last.delta.base == '"3"'  # against B's blob
        for saver in (a, b, cold):
            tup = saver.get_tuple(cfg)
            newest = [*items, "from b", "from a"]
            assert tup is not None and tup.checkpoint["channel_values"]["m"] == newest
            older = [t.checkpoint["channel_values"]["m"] for t in saver.list(cfg)]
            assert older == [newest, [*items, "from b"], items]
        assert store_a.verify("langgraph-t").ok


# -- logs written before deltas, and readers from before them ------------------------------


def test_a_log_written_with_whole_blobs_reads_as_it_did(tmp_path: Path) -> None:
    """fixtures/langgraph: a thread the saver wrote before deltas (commit 7ca6645), with
    what that code read back: every checkpoint reads the same, from its head cache and
    without it, and the thread continues."""
    serde = JsonPlusSerializer()
    expected = serde.loads_typed(
        ("msgpack", base64.b64decode((FIXTURES / "full-blobs.expected.b64").read_bytes()))
    )
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "full-blobs", root)
    cfg: Any = {"configurable": {"thread_id": "chat"}}
    for cached in (True, False):
        if not cached:
            for f in (root / "sessions" / "langgraph-chat").glob("fold-*"):
                f.unlink()
        with EventStoreSaver(root) as saver:
            got = [
                (t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
                for t in saver.list(None)
            ]
            assert serde.loads_typed(serde.dumps_typed(got)) == expected  # (tuples as lists)
            assert checkpoint_summary(saver.get_tuple(cfg)) == checkpoint_summary(
                saver.get_tuple(got[0][0])
            )
    with EventStoreSaver(root) as saver:
        assert all(b.delta is None for b in _blob_puts(saver.store, "langgraph-chat"))
        graph = _chat(saver)
        before = graph.get_state(cfg).values["messages"]
        graph.invoke({"messages": [HumanMessage("again", id="again")], "turns": 0}, cfg)
        after = graph.get_state(cfg).values["messages"]
        assert after[: len(before)] == before and after[len(before)].content == "again"
        assert saver.store.verify("langgraph-chat").ok


class _OldBlobPut(msgspec.Struct, array_like=True):
    """A blob as releases before deltas decode it (they ignore the trailing delta)."""

    channel: str
    version: str
    value: TypedValue | None


def test_an_older_release_reading_a_delta_raises_never_returns_a_wrong_value(
    tmp_path: Path,
) -> None:
    cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with EventStoreSaver(tmp_path) as saver:
        first = _grown(saver, cfg, ["m" * 200] * 10, "1")
        _grown(saver, first, ["m" * 200] * 11, "3")  # (not a power of two: a delta)
    last = SessionPaths(tmp_path, "langgraph-t").log.read_bytes().splitlines()[-1]
    old = [msgspec.convert(b, _OldBlobPut) for b in msgspec.json.decode(last)["blobs"]]
    assert [b.value for b in old] == [STAND_IN]
    with pytest.raises(NotImplementedError, match="Unknown serialization type"):
        JsonPlusSerializer().loads_typed((STAND_IN.type, STAND_IN.data))
    # and a serde that ignored the type name decodes no value from its bytes
    for decode in (ormsgpack.unpackb, json.loads, pickle.loads):
        with pytest.raises(Exception):  # noqa: B017 - each library's own error
            decode(STAND_IN.data)


# -- a delta whose base is not there is an error, never a value -----------------------------


@pytest.mark.parametrize("base", ["missing", "another"])
def test_a_delta_without_its_base_is_a_corrupt_log_error(tmp_path: Path, base: str) -> None:
    """A log the saver did not write so (edited, or a delta appended by hand): `list`,
    `get_tuple` and a cold read raise CorruptLogError naming the thread's log and seq."""
    cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    saver = EventStoreSaver(tmp_path)
    first = _grown(saver, cfg, ["m" * 200] * 10, "1")
    _grown(saver, first, ["m" * 200] * 11, "3")  # (not a power of two: a delta)
    forged = _blob_puts(saver.store, "langgraph-t")[-1]
    assert forged.delta is not None
    delta = msgspec.structs.replace(
        forged.delta,
        base='"9"' if base == "missing" else forged.delta.base,
        base_crc=forged.delta.base_crc if base == "missing" else forged.delta.base_crc ^ 1,
    )
    event = CheckpointPut(
        ns="",
        checkpoint_id="2" * 32,
        versions={"m": '"5"'},
        checkpoint=TypedValue(*saver.serde.dumps_typed({"id": "2" * 32})),
        metadata=TypedValue(*saver.serde.dumps_typed({})),
        blobs=[BlobPut("m", '"5"', STAND_IN, delta)],
    )
    saver.store.append("langgraph-t", [event])
    for reader in (saver, EventStoreSaver(tmp_path)):
        with pytest.raises(CorruptLogError, match=r"langgraph-t.*seq 3.*delta of channel 'm'"):
            list(reader.list(cfg))
        with pytest.raises(CorruptLogError, match=r"seq 3"):
            reader.get_tuple(cfg)
