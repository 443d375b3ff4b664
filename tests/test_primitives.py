"""The event-store primitives (issue 6): optimistic concurrency with `expected_seq`,
idempotent retries with `idempotency_key`, and custom events folded by user projections."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import (
    FlipCounted,
    FlipsPerRun,
    make_checkpoint,
    make_entry,
    make_features,
    make_manifest,
)

from eventstore import (
    AppendResult,
    ConcurrencyError,
    Event,
    EventStoreError,
    FeaturePassUpdated,
    FeatureRecord,
    InvalidArgumentError,
    InvalidRecordError,
    Message,
    ProgressAppended,
    ProgressEntry,
    Role,
    SessionManifest,
    SessionStore,
)
from eventstore.engines.file.layout import SessionPaths
from projections import (
    MAX_KEYS,
    StructProjection,
)

# a multiprocessing child a failed test left behind is killed after it
pytestmark = pytest.mark.usefixtures("no_leftover_children")

SID = "s1"


class Incr(Event, tag="incr", kw_only=True):
    """A counter increment carrying the value its writer computed (read-modify-append)."""

    value: int
    worker: str


class Counter(msgspec.Struct):
    value: int = 0
    seq: int = 0  # the last sequence number folded (any event type)


class CounterProjection(StructProjection[Counter]):
    name = "counter"
    version = 1
    event_types = frozenset({"incr"})
    state_type = Counter

    def initial(self) -> Counter:
        return Counter()

    def apply(self, state: Counter, event: Event) -> Counter:
        if type(event) is Incr:
            state.value = event.value
        state.seq = event.seq
        return state


class Unregistered(Event, tag="unregistered", kw_only=True):
    x: int = 0


def open_store(root: Path, **kw: Any) -> SessionStore:
    return SessionStore(
        root,
        event_types=[Incr, FlipCounted],
        projections=[CounterProjection(), FlipsPerRun()],
        **kw,
    )


def log_of(root: Path, sid: str = SID) -> Path:
    return SessionPaths(root, sid).log


def log_bytes(root: Path, sid: str = SID) -> bytes:
    p = log_of(root, sid)
    return p.read_bytes() if p.exists() else b""


def line_types(root: Path, sid: str = SID) -> list[str]:
    return [
        msgspec.json.decode(line, type=dict[str, Any])["type"]
        for line in log_bytes(root, sid).splitlines()
    ]


def incr_values(root: Path) -> list[tuple[int, int, str]]:
    """(seq, value, worker) of every `incr` line in the live log."""
    out = []
    for line in log_bytes(root).splitlines():
        d = msgspec.json.decode(line, type=dict[str, Any])
        if d["type"] == "incr":
            out.append((d["seq"], d["value"], d["worker"]))
    return out


# -- expected_seq ----------------------------------------------------------------------------


def _rma_worker(root: str, name: str, rounds: int, free: int, barrier: Any, out: str) -> None:
    """Read-modify-append: `rounds` in lock step with the other worker (both read the
    same state, then both append), then `free` successful increments running freely."""
    conflicts = wins = 0
    actual_ok = True
    with open_store(Path(root)) as s:
        for _ in range(rounds):
            st = s.load(SID, "counter")
            barrier.wait(10)
            try:
                s.append(SID, [Incr(value=st.value + 1, worker=name)], expected_seq=st.seq)
                wins += 1
            except ConcurrencyError as e:
                conflicts += 1
                actual_ok &= e.expected == st.seq and e.actual == st.seq + 1
            barrier.wait(10)
        done = 0
        while done < free:
            st = s.load(SID, "counter")
            try:
                s.append(SID, [Incr(value=st.value + 1, worker=name)], expected_seq=st.seq)
                done += 1
            except ConcurrencyError as e:
                conflicts += 1
                actual_ok &= e.actual > st.seq
    Path(out).write_text(f"{wins} {conflicts} {int(actual_ok)}")
    os._exit(0)


def test_two_processes_read_modify_append_with_expected_seq(tmp_path: Path) -> None:
    """Two processes increment a counter by read-modify-append with `expected_seq`. In
    lock-step rounds (both read the same state, both append) exactly one wins and the
    other gets ConcurrencyError carrying the actual seq; then running freely, every
    increment still lands: the logged values are exactly 1..N in sequence order (an
    undetected conflict would repeat a value, a lost update would leave a gap)."""
    root = tmp_path / "store"
    with open_store(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(1))
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    rounds, free = 40, 300
    outs = [tmp_path / f"w{i}.txt" for i in range(2)]
    procs = [
        ctx.Process(
            target=_rma_worker, args=(str(root), f"w{i}", rounds, free, barrier, str(outs[i]))
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = [tuple(int(x) for x in o.read_text().split()) for o in outs]
    lockstep_wins = sum(r[0] for r in results)
    conflicts = sum(r[1] for r in results)
    assert all(r[2] == 1 for r in results), "a ConcurrencyError carried a wrong seq"
    assert lockstep_wins == rounds  # exactly one winner per lock-step round
    assert conflicts >= rounds  # ... and the loser's conflict was detected every time
    total = rounds + 2 * free
    vals = incr_values(root)
    assert [v for _, v, _ in vals] == list(range(1, total + 1))
    seqs = [q for q, _, _ in vals]
    assert seqs == list(range(seqs[0], seqs[0] + total))  # nothing but increments written
    with open_store(root) as fresh:
        assert fresh.load(SID, "counter").value == total
        assert fresh.last_seq(SID) == seqs[-1]


def test_concurrency_error_carries_the_actual_seq_and_writes_nothing(tmp_path: Path) -> None:
    """expected_seq=0 means "must not exist yet"; a stale expected_seq raises
    ConcurrencyError (an EventStoreError) with expected and actual, and the log is
    byte-for-byte unchanged; the right expected_seq appends."""
    root = tmp_path / "store"
    with open_store(root) as s:
        assert s.last_seq(SID) == 0
        r = s.append(SID, [Incr(value=1, worker="a")], expected_seq=0)
        assert r == AppendResult(1, 1, replayed=False)
        before = log_bytes(root)
        for stale in (0, 2, 7):
            with pytest.raises(ConcurrencyError) as info:
                s.append(SID, [Incr(value=2, worker="a")], expected_seq=stale)
            assert isinstance(info.value, EventStoreError)
            assert (info.value.expected, info.value.actual) == (stale, 1)
            assert "1" in str(info.value) and str(stale) in str(info.value)
            assert log_bytes(root) == before
        with open_store(root) as other:  # a conflict seen from another instance too
            other.append(SID, [Incr(value=2, worker="b")], expected_seq=1)
        with pytest.raises(ConcurrencyError) as info:
            s.append(SID, [Incr(value=2, worker="a"), Incr(value=3, worker="a")], expected_seq=1)
        assert info.value.actual == 2
        r = s.append(SID, [Incr(value=3, worker="a"), Incr(value=4, worker="a")], expected_seq=2)
        assert (r.first_seq, r.last_seq) == (3, 4)
        assert [v for _, v, _ in incr_values(root)] == [1, 2, 3, 4]
        # a session that does not exist: only expected_seq=0 may create it
        with pytest.raises(ConcurrencyError) as info:
            s.append("new", [Incr(value=1, worker="a")], expected_seq=1)
        assert info.value.actual == 0 and log_bytes(root, "new") == b""
        assert s.append("new", [Incr(value=1, worker="a")], expected_seq=0).first_seq == 1


def test_expected_seq_survives_compaction(tmp_path: Path) -> None:
    """After compaction the last seq is unchanged, so a writer's expected_seq taken
    before the compaction still matches (a compaction is not a conflict)."""
    root = tmp_path / "store"
    with open_store(root) as s:
        for i in range(1, 6):
            s.append(SID, [Incr(value=i, worker="a")])
        seq = s.last_seq(SID)
        with open_store(root) as other:
            other.compact(SID, force=True)
        assert s.last_seq(SID) == seq
        assert s.append(SID, [Incr(value=6, worker="a")], expected_seq=seq).first_seq == seq + 1
        with pytest.raises(ConcurrencyError):
            s.append(SID, [Incr(value=6, worker="a")], expected_seq=seq)
        assert s.load(SID, "counter").value == 6


# -- idempotency keys ------------------------------------------------------------------------


def _progress(i: int) -> list[Event]:
    return [ProgressAppended(entry=make_entry(i)), FlipCounted(run_id="r", feature_id=f"f{i}")]


def test_retry_with_the_same_key_replays(tmp_path: Path) -> None:
    """A retry with the same key returns the first AppendResult with replayed=True and
    writes nothing: in the same instance, a new instance, and after compaction (with and
    without archive); it wins over a now-stale expected_seq."""
    root = tmp_path / "store"
    with open_store(root) as s:
        s.append(SID, _progress(0))
        first = s.append(SID, _progress(1), expected_seq=2, idempotency_key="k1")
        assert first == AppendResult(3, 4, replayed=False)
        s.append(SID, _progress(2))
        before = log_bytes(root)
        again = s.append(SID, _progress(1), expected_seq=2, idempotency_key="k1")
        assert again == AppendResult(3, 4, replayed=True)
        assert log_bytes(root) == before
    with open_store(root) as s:
        assert s.append(SID, _progress(1), idempotency_key="k1") == AppendResult(3, 4, True)
        assert log_bytes(root) == before
        s.compact(SID, force=True)
        compacted = log_bytes(root)
        assert s.append(SID, _progress(1), idempotency_key="k1") == AppendResult(3, 4, True)
        s.compact(SID, archive=False, force=True)
    with open_store(root) as s:
        assert s.append(SID, _progress(1), idempotency_key="k1") == AppendResult(3, 4, True)
        assert len(log_bytes(root).splitlines()) == 1
        assert compacted.splitlines()[0].startswith(b'{"type":"snapshot"')
        assert s.load(SID, "flips") == {"r": 3}
        assert [e.summary for e in s.load_bootstrap_state(SID).recent_progress] == [
            "step 0",
            "step 1",
            "step 2",
        ]
        # a new key writes
        assert s.append(SID, _progress(3), idempotency_key="k2") == AppendResult(7, 8, False)


def _append_keyed(root: str, key: str, out: str | None, die: Callable[[], None] | None) -> None:
    """Child: append with `key`; `die` (if given) kills the process right after the log
    write returns, before append() can return its result."""
    with open_store(Path(root)) as s:
        if die is not None:
            real = os.write

            def write_then_die(fd: int, data: Any) -> int:
                n = real(fd, data)
                die()
                return n

            os.write = write_then_die  # type: ignore[assignment]
        r = s.append(SID, _progress(5), idempotency_key=key)
        if out is not None:
            Path(out).write_text(f"{r.first_seq} {r.last_seq} {r.replayed}")
    os._exit(0)


@pytest.mark.parametrize(
    "how", ["replied", "exit_after_write", "sigkill_after_write"], ids=lambda x: x
)
def test_retry_across_processes_and_after_a_kill(tmp_path: Path, how: str) -> None:
    """A child process appends with a key and either replies, exits, or is SIGKILLed
    between the write and the reply; the parent (another process, another instance)
    retries with the same key: replayed, and exactly one copy is in the log."""
    root = tmp_path / "store"
    with open_store(root) as s:
        s.append(SID, _progress(0))
    out = tmp_path / "reply.txt"
    die: Callable[[], None] | None = {
        "replied": None,
        "exit_after_write": lambda: os._exit(3),
        "sigkill_after_write": lambda: os.kill(os.getpid(), signal.SIGKILL),
    }[how]
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_append_keyed, args=(str(root), "retry-me", str(out), die))
    p.start()
    p.join(30)
    if how == "replied":
        assert p.exitcode == 0 and out.read_text() == "3 4 False"
    else:
        assert p.exitcode in (3, -signal.SIGKILL) and not out.exists()
    with open_store(root) as s:
        r = s.append(SID, _progress(5), idempotency_key="retry-me")
        assert r == AppendResult(3, 4, replayed=True)
        summaries = [e.summary for e in s.load_bootstrap_state(SID).recent_progress]
        assert summaries == ["step 0", "step 5"]
        assert s.load(SID, "flips") == {"r": 2}
        assert s.last_seq(SID) == 4


def test_key_bound_is_the_newest_1000_keys(tmp_path: Path) -> None:
    """The documented bound: a session remembers its newest MAX_KEYS (1,000) keys, also
    across a restart and a compaction. The oldest key is forgotten once 1,000 newer keys
    were used; a retry with it then writes a second copy (at-most-once is not promised
    beyond the bound)."""
    assert MAX_KEYS == 1000
    root = tmp_path / "store"
    with open_store(root) as s:
        s.append(SID, [Incr(value=0, worker="k")], idempotency_key="key-0")
        for i in range(1, 1000):
            s.append(SID, [Incr(value=i, worker="k")], idempotency_key=f"key-{i}")
        # key-0 is the oldest of exactly 1,000: still remembered
        assert s.append(SID, [Incr(value=0, worker="k")], idempotency_key="key-0").replayed
        s.append(SID, [Incr(value=1000, worker="k")], idempotency_key="key-1000")
        s.compact(SID, force=True)
    with open_store(root) as s:
        before = log_bytes(root)
        for i in (1, 500, 1000):
            r = s.append(SID, [Incr(value=i, worker="k")], idempotency_key=f"key-{i}")
            assert r == AppendResult(i + 1, i + 1, replayed=True)
        assert log_bytes(root) == before
        assert len(s.load(SID, "idempotency")) == 1000
        # key-0 has 1,000 newer keys: forgotten, the retry writes again
        r = s.append(SID, [Incr(value=0, worker="k")], idempotency_key="key-0")
        assert r == AppendResult(1002, 1002, replayed=False)
        again = s.append(SID, [Incr(value=0, worker="k")], idempotency_key="key-0")
        assert again == AppendResult(1002, 1002, replayed=True)  # remembered anew
        assert len(s.load(SID, "idempotency")) == 1000
        assert not s.append(SID, [Incr(value=1, worker="k")], idempotency_key="key-1").replayed


SESSION_WRITES: dict[str, Callable[[SessionStore, str], Any]] = {
    "initialize_session_if_missing": lambda s, k: s.initialize_session_if_missing(
        "other",
        make_manifest("other"),
        make_features(2),
        make_entry(0),
        make_checkpoint(),
        idempotency_key=k,
    ),  # fmt: skip
    "save_manifest": lambda s, k: s.save_manifest(
        SID, make_manifest(SID, current_objective="new"), idempotency_key=k
    ),
    "append_progress_entry": lambda s, k: s.append_progress_entry(
        SID, make_entry(9), idempotency_key=k
    ),
    "replace_feature_list": lambda s, k: s.replace_feature_list(
        SID, make_features(4), idempotency_key=k
    ),
    "update_feature_pass": lambda s, k: s.update_feature_pass(SID, "f1", True, idempotency_key=k),
    "record_run_checkpoint": lambda s, k: s.record_run_checkpoint(
        SID, make_checkpoint("run-9"), idempotency_key=k
    ),
    "append_transcript_messages": lambda s, k: s.append_transcript_messages(
        SID,
        [Message(role=Role.USER, content="a"), Message(role=Role.ASSISTANT, content="b")],
        idempotency_key=k,
    ),
}


def _replay_of(first: object) -> object:
    """What a retry with the same key returns: the first AppendResult, marked replayed
    (initialize_session_if_missing answers True again)."""
    return (
        msgspec.structs.replace(first, replayed=True) if isinstance(first, AppendResult) else first
    )


@pytest.mark.parametrize("op", sorted(SESSION_WRITES))
def test_every_session_write_is_idempotent_with_a_key(tmp_path: Path, op: str) -> None:
    """Each write of the session API accepts idempotency_key; a retry (same instance,
    then a new one) returns the same answer and writes nothing: one copy."""
    root = tmp_path / "store"
    with open_store(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
        sid = "other" if op == "initialize_session_if_missing" else SID
        first = SESSION_WRITES[op](s, "op-key")
        after_first = log_bytes(root, sid)
        state = (s.load_bootstrap_state(sid), s.load_transcript_messages(sid))
        assert SESSION_WRITES[op](s, "op-key") == _replay_of(first)
        assert log_bytes(root, sid) == after_first
    with open_store(root) as s:
        assert SESSION_WRITES[op](s, "op-key") == _replay_of(first)
        assert log_bytes(root, sid) == after_first
        assert (s.load_bootstrap_state(sid), s.load_transcript_messages(sid)) == state
        if op == "initialize_session_if_missing":
            assert first is True  # True both times, written once
            assert line_types(root, sid) == [
                "manifest_set",
                "feature_list_replaced",
                "progress_appended",
                "checkpoint_recorded",
            ]
            # without the key, the contract's answer: already initialized
            assert s.initialize_session_if_missing(sid, make_manifest(sid), []) is False
        # the same op under a new key writes again (except the initialization)
        SESSION_WRITES[op](s, "op-key-2")
        grew = log_bytes(root, sid) != after_first
        assert grew is (op != "initialize_session_if_missing")


@pytest.mark.parametrize(
    "op", ["is_initialized", "load_bootstrap_state", "load_transcript_messages"]
)
def test_session_reads_accept_an_idempotency_key(tmp_path: Path, op: str) -> None:
    """The three reads of the session API accept (and ignore) idempotency_key, so a
    harness can pass one uniformly to every operation."""
    with open_store(tmp_path / "store") as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(1))
        assert getattr(s, op)(SID, idempotency_key="k") == getattr(s, op)(SID)


def test_feature_not_found_with_a_key_writes_nothing_and_remembers_nothing(
    tmp_path: Path,
) -> None:
    """A write refused by validation does not consume its key: after the feature exists,
    the same key writes."""
    root = tmp_path / "store"
    with open_store(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(1))
        before = log_bytes(root)
        with pytest.raises(KeyError):
            s.update_feature_pass(SID, "nope", True, idempotency_key="k")
        assert log_bytes(root) == before
        s.replace_feature_list(SID, [*make_features(1), make_features(2)[1]])
        s.update_feature_pass(SID, "f2", True, idempotency_key="k")
        assert line_types(root)[-1] == "feature_pass_updated"


# -- custom events ---------------------------------------------------------------------------


def test_custom_events_fold_beside_the_builtin_ones(tmp_path: Path) -> None:
    """A user-defined event, appended with `append` in one batch with built-in events,
    is folded by a user projection while the built-in projections see their own events;
    a fresh instance folds the same; the line is plain JSON with its tag."""
    root = tmp_path / "store"
    with open_store(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
        r = s.append(
            SID,
            [
                FlipCounted(run_id="run-1", feature_id="f1"),
                FeaturePassUpdated(feature_id="f1", passes=True),
                FlipCounted(run_id="run-2", feature_id="f2"),
                FlipCounted(run_id="run-1", feature_id="f2"),
            ],
        )
        assert (r.first_seq, r.last_seq) == (3, 6)
        assert s.load(SID, "flips") == {"run-1": 2, "run-2": 1}
        assert s.load(SID, FlipsPerRun()) == {"run-1": 2, "run-2": 1}
        assert [f.passes for f in s.load_bootstrap_state(SID).feature_list] == [True, False]
        st = s.load(SID, "flips")
        st["run-1"] = 99  # load returns a copy
        assert s.load(SID, "flips")["run-1"] == 2
    with open_store(root) as fresh:
        assert fresh.load(SID, "flips") == {"run-1": 2, "run-2": 1}
    assert line_types(root).count("flip_counted") == 3
    with pytest.raises(KeyError):
        SessionStore(root).load(SID, "flips")  # a store that does not register it


def test_unregistered_event_type_is_refused_and_nothing_written(tmp_path: Path) -> None:
    """An Event subclass the store was not given, or a non-event, raises
    InvalidRecordError before anything is written (also inside an otherwise valid batch,
    and for a new session no file appears)."""
    root = tmp_path / "store"
    with open_store(root) as s:
        for bad in ([Unregistered()], [Incr(value=1, worker="a"), Unregistered()], [{"x": 1}]):
            with pytest.raises(InvalidRecordError):
                s.append("fresh", bad)  # type: ignore[arg-type]
        assert not log_of(root, "fresh").exists()
        s.append(SID, [Incr(value=1, worker="a")])
        before = log_bytes(root)
        with pytest.raises(InvalidRecordError):
            s.append(SID, [Incr(value=2, worker="a"), Unregistered()], idempotency_key="kk")
        with pytest.raises(InvalidRecordError):
            s.append(SID, [Incr(value="two", worker="a")])  # type: ignore[arg-type]
        assert log_bytes(root) == before
        assert s.last_seq(SID) == 1
        # the key of a refused append was not consumed
        assert not s.append(SID, [Incr(value=2, worker="a")], idempotency_key="kk").replayed


def test_a_plain_store_learns_event_types_and_projections(tmp_path: Path) -> None:
    """`learn` gives a plainly opened store what the constructor would have: a session
    written with those types (by another store) folds the same as in a store opened
    with them; what was read before as unknown is named once learned; learning again
    changes nothing."""
    root = tmp_path / "store"
    with open_store(root) as s:
        s.append(SID, [Incr(value=2, worker="a"), FlipCounted(run_id="r", feature_id="f")])
    with SessionStore(root) as plain:
        assert [type(e).__name__ for e in plain.read_events(SID)] == ["UnknownEvent"] * 2
        assert plain.verify(SID).problems  # unknown_type warnings
        assert plain.learn([Incr, FlipCounted], [CounterProjection(), FlipsPerRun()])
        assert not plain.learn([Incr], [FlipsPerRun()])
        assert [type(e) for e in plain.read_events(SID)] == [Incr, FlipCounted]
        assert plain.verify(SID).problems == []
        assert plain.load(SID, "flips") == {"r": 1}
        plain.append(SID, [FlipCounted(run_id="r", feature_id="g")])
        assert plain.load(SID, "flips") == {"r": 2}
    with open_store(root) as s:
        assert s.load(SID, "flips") == {"r": 2}


def test_learning_a_taken_tag_or_name_is_a_typed_error_and_learns_nothing(
    tmp_path: Path,
) -> None:
    class OtherIncr(Event, tag="incr", kw_only=True):
        n: int = 0

    class OtherFlips(FlipsPerRun):
        pass

    with open_store(tmp_path / "store") as s:
        with pytest.raises(InvalidRecordError, match="incr"):
            s.learn([Unregistered, OtherIncr])
        with pytest.raises(InvalidArgumentError, match="flips"):
            s.learn([Unregistered], [OtherFlips()])
        with pytest.raises(InvalidArgumentError):
            s.learn([], [object()])  # type: ignore[list-item]
        with pytest.raises(InvalidRecordError):
            s.learn([int])  # type: ignore[list-item]
        with pytest.raises(InvalidRecordError):
            s.append(SID, [Unregistered()])  # nothing was learned
        assert s.last_seq(SID) == 0


# -- attacks: user projections that change their events or cannot encode their state -------


_SID = "s"


class Meddler(StructProjection[int]):
    """A user projection whose apply changes the events it is given: it empties each
    `messages` list, tags each message's metadata and adds a step to each feature."""

    name = "meddler"
    version = 1
    event_types: frozenset[str] | None = None
    state_type = int

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        for f in getattr(event, "features", ()):
            f.steps.append("meddled")
        messages = getattr(event, "messages", None)
        if messages is not None:
            for m in messages:
                m.metadata["meddled"] = "yes"
            messages.clear()
        return state + 1


def _manifest() -> SessionManifest:
    return SessionManifest(session_id=_SID, active_branch="main", current_objective="o")


def _feature() -> FeatureRecord:
    return FeatureRecord(id="f1", category="c", description="d", steps=["a"], passes=False)


def test_a_projection_that_changes_its_events_does_not_change_the_built_in_states(
    tmp_path: Path,
) -> None:
    """Promise: a load returns the state folded from the log: the same in this store
    and in a fresh one. Broken: an append folded its events into every cached state,
    sharing the event objects, so a user projection loaded first that emptied
    `event.messages` left the transcript without the appended messages, and one that
    changed a record's list (a feature's steps, a message's metadata) changed the
    bootstrap and transcript states this store returned. A user projection now folds
    the batch decoded from the bytes written (as a cold load would give it)."""
    with SessionStore(tmp_path, projections=[Meddler()]) as s:
        assert s.load(_SID, "meddler") == 0  # folded first: applied first on append
        s.load_transcript_messages(_SID)
        s.load_bootstrap_state(_SID)
        s.initialize_session_if_missing(_SID, _manifest(), [_feature()])
        s.append_transcript_messages(_SID, [Message(role=Role.USER, content="hi")])
        s.append_transcript_messages(_SID, [Message(role=Role.USER, content="there")])
        warm = (s.load_bootstrap_state(_SID), s.load_transcript_messages(_SID))
        assert s.load(_SID, "meddler") == 4
    with SessionStore(tmp_path) as fresh:
        cold = (fresh.load_bootstrap_state(_SID), fresh.load_transcript_messages(_SID))
    assert warm == cold
    assert warm[0].feature_list == [_feature()]
    assert [m.content for m in warm[1]] == ["hi", "there"]
    assert all(m.metadata == {} for m in warm[1])


def test_compaction_with_a_projection_that_changes_its_events_saves_a_true_fold_cache(
    tmp_path: Path,
) -> None:
    """Promise: a fold cache holds the state folded from the log ("used only while it
    checks against the log"). Broken: compaction folds the built-in projections, then
    the user's, over the same decoded events, and saves the bootstrap state it folded
    to the fold cache after them: a user projection that added a step to each feature
    record changed the bootstrap state cached, which every later cold load (in any
    process, with or without that projection) returned, though the snapshot is right.
    Fixed in eventstore/compaction.py: each user projection folds a decode of its own
    (what a cold load gives it)."""
    with SessionStore(tmp_path) as s:
        s.initialize_session_if_missing(_SID, _manifest(), [_feature()])
        for _ in range(20):
            s.append_progress_entry(_SID, ProgressEntry(run_id="r", summary="x" * 200))
    with SessionStore(tmp_path, projections=[Meddler()]) as s:
        assert s.compact(_SID).compacted
    with SessionStore(tmp_path) as fresh:
        assert fresh.load_bootstrap_state(_SID).feature_list == [_feature()]
