"""Attacks from outside on the newest hot paths: the append path that validates records
by one round trip of the stamped event (and copies plain messages without one), an
opening snapshot decoded by its layout, cold `last=N` pages that remember the snapshot
lines they checked, and the engine records that became msgspec Structs.

The rules under attack (README, Guarantees): a load never returns what failed its
check; bad input gets a typed error and changes nothing; what is stored reads back
equal and is a private copy.
"""

from __future__ import annotations

import enum
import json
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import oracle
import pytest
from conftest import every_transcript_load, log_path, make_entry, make_features, make_manifest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import aware_datetimes, texts

from eventstore import (
    EventStoreError,
    InvalidRecordError,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    SessionStore,
    TextBlock,
    ToolUseBlock,
)
from eventstore.aio import AsyncSessionStore
from eventstore.errors import CorruptLogError
from eventstore.format import reader as log_module
from eventstore.format.events import (
    Event,
    EventCodec,
    MessagesAppended,
    NotAsStoredError,
    validated_copy,
)
from eventstore.format.events import (
    Event,
    MessagesAppended,
)
from projections import StructProjection

SID = "s"
TS = datetime(2026, 1, 2, tzinfo=UTC)


def _compacted(root: Path, n: int, *, archive: bool = True, after: int = 2) -> None:
    with SessionStore(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
        for i in range(n):
            s.append_transcript_messages(SID, [Message(Role.USER, f"msg{i:04d} " + "w" * 100)])
        assert s.compact(SID, force=True, archive=archive).compacted
        for i in range(after):
            s.append_transcript_messages(SID, [Message(Role.USER, f"after {i}")])


def _drop_caches(root: Path) -> None:
    """Remove the fold caches and checked prefix beside the log (a cold reader)."""
    for p in log_path(root, SID).parent.iterdir():
        if p.is_file() and p.name not in ("log.jsonl", "log.lock"):
            p.unlink()


# -- 1. cold last=N pages remember the snapshot lines they checked ---------------------


@pytest.mark.usefixtures("no_transcript_cache")  # the log read itself is attacked
def test_a_remembered_snapshot_check_never_vouches_for_bytes_changed_since(root: Path) -> None:
    """A store pages `last=N` from a compacted log (checking the snapshot line whole and
    remembering its `h`). The snapshot's transcript entry is then edited in place,
    its `h` left as it was (so the line fails its check). The next page on the same
    store must not return the edited message: it was never checked."""
    _compacted(root, 50, after=0)
    log = log_path(root, SID)
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID, last=2)[-1].content.startswith("msg0049")
        data = log.read_bytes()
        edited = data.replace(b"msg0049", b"EVIL049", 1)
        assert len(edited) == len(data)
        with open(log, "r+b") as fh:  # in place: the same file, the same size
            fh.write(edited)
        try:
            page = s.load_transcript_messages(SID, last=2)
        except CorruptLogError:
            page = None
        assert page is None or all("EVIL" not in m.content for m in page)
        with pytest.raises(CorruptLogError):  # what a fresh store says
            SessionStore(root).load_transcript_messages(SID, last=2)
        # a header edited to point the transcript elsewhere is no better
        log.write_bytes(data)
        assert s.load_transcript_messages(SID, last=1)[0].content.startswith("msg0049")
        head = json.loads(data[: data.index(b',"states":{')] + b"}")
        a, b = head["layout"]["transcript"]
        lying = data.replace(b"[%d,%d]" % (a, b), b"[%d,%d]" % (a, b - 1), 1)
        assert lying != data and len(lying) == len(data)
        with open(log, "r+b") as fh:
            fh.write(lying)
        try:
            page = s.load_transcript_messages(SID, last=3)
        except CorruptLogError:
            page = None
        assert page is None or [m.content[:7] for m in page] == ["msg0047", "msg0048", "msg0049"]


def test_a_remembered_snapshot_still_pages_cheaply_and_equal(root: Path) -> None:
    """The remembered check keeps working for an unchanged line (and for another
    compaction's line): every page equals the fold."""
    _compacted(root, 300)
    with SessionStore(root) as s:
        pages = [s.load_transcript_messages(SID, last=k) for k in (1, 5, 120, 302, 400)]
        assert sess_checked(s)
        with SessionStore(root) as other:
            other.append_transcript_messages(SID, [Message(Role.USER, "x")])
            assert other.compact(SID, force=True).compacted
        pages.append(s.load_transcript_messages(SID, last=7))
    with SessionStore(root) as cold:
        full = cold.load_transcript_messages(SID)
    assert [len(p) for p in pages] == [1, 5, 120, 302, 302, 7]
    assert pages[:5] == [full[:-1][-k:] for k in (1, 5, 120, 302, 400)]
    assert pages[5] == full[-7:]


def sess_checked(s: SessionStore) -> bool:
    return bool(s.cache_info(SID).checked_snapshots)


# -- 2. an opening snapshot decoded by its layout ---------------------------------------


def _forge_second_states(line: bytes, key: bytes) -> bytes:
    """The snapshot `line` with a second (empty) states object after the first, its
    `length` and `h` made to match (a forger's edit: the hash is not a secret)."""
    head = json.loads(line[: line.index(b',"states":{')] + b"}")
    body = line[:-24] + b"," + key + b":{}"
    length = len(body) + 24
    assert len(str(length)) == len(str(head["length"]))
    body = body.replace(b'"length":%d' % head["length"], b'"length":%d' % length, 1)
    return oracle.rehash(body + line[-24:], head["base_h"])


@pytest.mark.parametrize("key", [b'"states"', b'"st\\u0061tes"'])
def test_a_snapshot_declaring_its_states_twice_decodes_as_the_whole_line_says(
    root: Path, key: bytes
) -> None:
    """JSON decoders keep the last of two equal keys: a line whose states object is
    followed by `"states":{}` holds no states when decoded whole. Decoded by its layout
    it must say the same (the same events either way), and a load must give the same
    answer whichever way the line was decoded."""
    _compacted(root, 800, archive=False)
    log = log_path(root, SID)
    snap, rest = log.read_bytes().split(b"\n", 1)
    assert len(snap) > log_module.LONG_SNAPSHOT
    forged = _forge_second_states(snap, key)
    data = forged + b"\n" + rest
    dec = EventCodec().decoder(frozenset({"messages_appended"}))
    whole = dec.decode_lines(data)
    assert whole[0].states == {}  # type: ignore[attr-defined]
    cut = log_module._decode_lines(dec, memoryview(data), 0)
    assert cut == whole and cut[0].states == {}  # type: ignore[attr-defined]
    log.write_bytes(data)

    def outcome() -> object:
        _drop_caches(root)
        try:
            with SessionStore(root) as s:
                return s.load_transcript_messages(SID)
        except EventStoreError as exc:
            return type(exc)

    by_layout = outcome()
    long_enough = log_module.LONG_SNAPSHOT
    log_module.LONG_SNAPSHOT = 1 << 40  # every snapshot decoded whole
    try:
        assert by_layout == outcome()
    finally:
        log_module.LONG_SNAPSHOT = long_enough


# -- 3. the append hot path: one round trip of the stamped event -------------------------


class _Str(str):
    pass


class _Int(int):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _List(list):  # type: ignore[type-arg]
    pass


class _DateTime(datetime):
    pass


class _StrRole(enum.StrEnum):
    USER = "user"


class _Always:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


_odd_values = st.one_of(
    texts,
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-0.0, 5e-324, 1e308, True, False, None]),
    st.builds(_Str, texts),
    st.builds(_Int, st.integers(-5, 5)),
    st.builds(lambda d: _Dict(d), st.dictionaries(texts, st.integers(), max_size=2)),
    st.builds(lambda v: _List(v), st.lists(st.integers(), max_size=2)),
    st.builds(lambda k: {k: 1}, st.one_of(st.integers(), st.builds(_Str, texts), st.just((1,)))),
    st.sampled_from([(1, 2), frozenset({1}), {1}, b"x", bytearray(b"x"), _StrRole.USER, Role.USER]),
    st.builds(_Always),
    st.builds(lambda d: _DateTime.fromtimestamp(d.timestamp(), UTC), aware_datetimes),
)
_odd_messages = st.builds(
    Message,
    role=st.sampled_from([Role.USER, Role.TOOL, _StrRole.USER, "user"]),
    content=st.one_of(texts, st.builds(_Str, texts)),
    name=st.one_of(st.none(), texts, st.builds(_Str, texts)),
    blocks=st.one_of(
        st.just([]),
        st.builds(lambda: _List()),
        st.lists(
            st.one_of(
                st.builds(TextBlock, texts),
                st.builds(
                    ToolUseBlock,
                    id=texts,
                    name=texts,
                    input=st.dictionaries(texts, _odd_values, max_size=2),
                ),
            ),
            max_size=2,
        ),
    ),
    created_at=st.one_of(
        st.none(),
        aware_datetimes,
        st.builds(lambda d: _DateTime.fromtimestamp(d.timestamp(), UTC), aware_datetimes),
        st.just(datetime(2026, 1, 1, tzinfo=timezone(timedelta(seconds=30)))),
    ),
    metadata=st.one_of(
        st.just({}),
        st.builds(lambda: _Dict()),
        st.dictionaries(texts, _odd_values, max_size=3),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_odd_messages, min_size=1, max_size=3))
def test_odd_values_are_judged_like_the_record_check_and_folded_as_the_line_reads(
    msgs: list[Message],
) -> None:
    """Subclasses of str/int/dict/list/datetime, str-valued enums, NaN and infinities,
    -0.0, ints past 64 bits, keys that are not str, sets and tuples, an object equal to
    everything: the event round trip accepts exactly what `validated_copy` of each
    record accepts, and what it folds is, value and type, what the line reads back as."""
    per_record = True
    try:
        for i, m in enumerate(msgs):
            validated_copy(m, Message, f"messages[{i}]")
    except InvalidRecordError:
        per_record = False
    codec = EventCodec()
    try:
        data, stamped, _ = codec.encode_batch(
            [MessagesAppended(messages=msgs)], 1, "", TS, None, check=True
        )
    except NotAsStoredError:
        assert not per_record
        return
    assert per_record
    read = codec.decode_line(data[:-1], 0, "log")
    assert isinstance(read, MessagesAppended)
    folded = stamped[0].messages  # type: ignore[attr-defined]
    assert folded == read.messages == msgs
    assert msgspec.json.encode(folded) == msgspec.json.encode(read.messages)
    assert repr(folded) == repr(read.messages)  # the same types all the way down
    for given_m, got in zip(msgs, folded, strict=True):
        assert got is not given_m
        assert got.blocks is not given_m.blocks and got.metadata is not given_m.metadata


_ODD_BUT_VALID: list[Message] = [
    Message(Role.USER, "plain"),
    Message(Role.USER, "enum-valued metadata", metadata={"k": _StrRole.USER}),
    Message(Role.USER, "big ints", metadata={"a": 2**70, "b": -(2**70), "z": -0.0}),
    Message(Role.USER, "containers", blocks=_List(), metadata=_Dict(x=_List([1]))),
    Message(
        Role.ASSISTANT,
        "zone",
        created_at=datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=5, minutes=45))),
        blocks=[ToolUseBlock("t", "n", {_Str("k"): [1.5, None, True]})],
    ),
]


@pytest.mark.parametrize("keyed", [False, True])
def test_odd_but_valid_records_read_back_equal_warm_cold_and_keyed(root: Path, keyed: bool) -> None:
    key: dict[str, Any] = {"idempotency_key": "k"} if keyed else {}
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID) == []  # folded: appends fold into it
        s.append_transcript_messages(SID, _ODD_BUT_VALID, **key)
        entry = ProgressEntry("r", "s", created_at=datetime(2026, 1, 1, tzinfo=UTC))
        s.append_progress_entry(SID, entry, **({"idempotency_key": "p"} if keyed else {}))
        warm = s.load_transcript_messages(SID)
        warm_progress = s.load_bootstrap_state(SID).recent_progress
    with SessionStore(root) as cold:
        assert cold.load_transcript_messages(SID) == warm == _ODD_BUT_VALID
        assert repr(cold.load_transcript_messages(SID)) == repr(warm)
        assert cold.load_bootstrap_state(SID).recent_progress == warm_progress == [entry]


def test_a_message_changed_by_another_thread_while_appended_is_stored_as_its_line(
    root: Path,
) -> None:
    """Other threads keep changing the blocks and metadata of the messages being
    appended (plain ones gaining content, rich ones changing): each append either
    refuses with InvalidRecordError (nothing written) or stores one picture of them,
    and what the store folded equals what a cold load of the log reads."""
    plain = [Message(Role.USER, f"p{i}") for i in range(4)]
    rich = [
        Message(Role.ASSISTANT, f"r{i}", blocks=[TextBlock("b")], metadata={"n": [0]})
        for i in range(4)
    ]
    stop = threading.Event()

    def vandal() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            time.sleep(0.0005)  # the appender gets the GIL
            for m in (*plain, *rich):
                m.blocks.append(TextBlock(str(n)))
                m.metadata["n"] = [n]
                if len(m.blocks) > 3:
                    del m.blocks[:2]
                if n % 3 == 0:
                    m.blocks.clear()
                    m.metadata.clear()

    errors = []
    threads = [threading.Thread(target=vandal) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside an append, not only between
    with SessionStore(root) as s:
        s.load_transcript_messages(SID)
        for t in threads:
            t.start()
        try:
            for i in range(300):
                batch = [plain[i % 4], rich[i % 4]] if i % 2 else [plain[i % 4]]
                before = s.last_seq(SID)
                try:
                    s.append_transcript_messages(SID, batch)
                except InvalidRecordError as exc:
                    errors.append(exc)
                    assert s.last_seq(SID) == before
        finally:
            stop.set()
            for t in threads:
                t.join()
            sys.setswitchinterval(interval)
        warm = s.load_transcript_messages(SID)
        warm_last = s.load_transcript_messages(SID, last=5)
    with SessionStore(root) as cold:
        assert cold.load_transcript_messages(SID) == warm
        assert cold.load_transcript_messages(SID, last=5) == warm_last == warm[-5:]
        assert cold.verify(SID).ok
    # the messages were valid at every instant: none is refused (as the keyed path,
    # which validates a copy first, never refuses them)
    assert errors == []
    assert len(warm) == 450


def test_a_valid_message_changed_between_its_encode_and_its_check_is_not_refused(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deterministically, what the thread race above does: another thread changes a
    (valid) message right after the hot path encoded it, before the round trip is
    compared. The message was valid at every instant: the append must store one
    picture of it (as the keyed path would), not refuse it with NotAsStoredError."""
    msg = Message(Role.ASSISTANT, "rich", blocks=[TextBlock("a")], metadata={"n": 1})
    real = EventCodec.read_back
    changed = [False]

    def decode_after_a_change(self: EventCodec, body: bytes, cls: type[Event]) -> Event:
        if not changed[0]:
            changed[0] = True
            msg.metadata["n"] = 2  # the other thread, between encode and compare
            msg.blocks.append(TextBlock("b"))
        return real(self, body, cls)

    assert store.load_transcript_messages(SID) == []
    monkeypatch.setattr(EventCodec, "read_back", decode_after_a_change)
    store.append_transcript_messages(SID, [msg])
    monkeypatch.setattr(EventCodec, "read_back", real)
    assert changed == [True]  # the round trip ran, and the message changed before it
    warm = store.load_transcript_messages(SID)
    assert warm in (
        [Message(Role.ASSISTANT, "rich", blocks=[TextBlock("a")], metadata={"n": 1})],
        [msg],
    )
    with SessionStore(store.root) as cold:
        assert cold.load_transcript_messages(SID) == warm


def test_appends_beside_another_stores_compactions_fold_what_a_cold_load_reads(
    root: Path,
) -> None:
    """One store appends on the hot path (messages, progress, checkpoints) while another
    instance (its own engine, as another process would be) compacts in a loop; the
    writer's folded states equal a cold load's after, every append is there once."""
    with SessionStore(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
    stop = threading.Event()
    compactions = [0]

    def compactor() -> None:
        with SessionStore(root) as other:
            while not stop.is_set():
                if other.compact(SID, force=True).compacted:
                    compactions[0] += 1

    t = threading.Thread(target=compactor)
    with SessionStore(root) as s:
        s.load_transcript_messages(SID)
        s.load_bootstrap_state(SID)
        t.start()
        try:
            for i in range(200):
                s.append_transcript_messages(SID, [Message(Role.USER, f"m{i}")])
                if i % 3 == 0:
                    s.append_progress_entry(SID, make_entry(i))
                if i % 7 == 0:
                    s.record_run_checkpoint(SID, RunCheckpoint(f"run{i}"))
        finally:
            stop.set()
            t.join()
        warm = (s.load_transcript_messages(SID), s.load_bootstrap_state(SID))
    with SessionStore(root) as cold:
        assert (cold.load_transcript_messages(SID), cold.load_bootstrap_state(SID)) == warm
        assert cold.verify(SID).ok
    assert [m.content for m in warm[0]] == [f"m{i}" for i in range(200)]
    assert len(warm[1].recent_progress) == 67 and len(warm[1].checkpoints) == 29
    assert compactions[0] > 0


# -- 4. compacted logs with odd snapshots, through every load API ------------------------


class Whatever(Event, tag="whatever_happened", kw_only=True):
    """A custom event type: unknown to a store opened without it."""

    what: str


def _named(name: str, big: bool = False) -> type[StructProjection[Any]]:
    class Counter(StructProjection[dict[str, Any]]):
        event_types = frozenset({"whatever_happened", "messages_appended"})
        state_type = dict[str, Any]

        def initial(self) -> dict[str, Any]:
            return {}

        def apply(self, state: dict[str, Any], event: Event) -> dict[str, Any]:
            if name == "empty":
                pass  # its state stays {}: an entry of `{"version":1,"state":{}}`
            elif type(event) is Whatever:
                state[event.what] = state.get(event.what, 0) + 1
            elif big and type(event) is MessagesAppended:
                state.setdefault("texts", []).extend(m.content for m in event.messages)
            return state

    Counter.name = name
    return Counter


_NAMES = ['q"uote\\back', "ünï ✓ \u2028", 'x,"states":{', "ctl\x01\x1f", "empty"]


def _projections() -> list[StructProjection[Any]]:
    return [_named(n, big=(i == 0))() for i, n in enumerate(_NAMES)]


def _everything(s: SessionStore | Any) -> dict[str, Any]:
    last = s.last_seq(SID)
    out: dict[str, Any] = {
        "transcript": s.load_transcript_messages(SID),
        "bootstrap": s.load_bootstrap_state(SID),
        "last": [s.load_transcript_messages(SID, last=k) for k in (0, 1, 7, 10_000)],
        "pages": [
            s.load_transcript_messages(SID, start=a, limit=b)
            for a, b in ((0, 3), (5, None), (10_000, 2))
        ],
        "state_at": s.state_at(SID, seq=last),
        "transcript_at": s.transcript_at(SID, seq=last),
        "state_at_mid": s.state_at(SID, seq=last // 2),
        "events": [
            (type(e).__name__, e.seq) for e in s.read_events(SID) if type(e).__name__ != "Snapshot"
        ],
        "verify": s.verify(SID).ok,
    }
    for n in _NAMES:
        try:
            out[n] = s.load(SID, n)
        except KeyError:
            out[n] = "unknown projection"
    return out


def _write_history(s: SessionStore) -> None:
    s.initialize_session_if_missing(SID, make_manifest(SID), make_features(3))
    for i in range(400):
        s.append_transcript_messages(
            SID, [Message(Role.USER, f"m{i} " + "t" * (i % 300)), Message(Role.TOOL, "")]
        )
        if i % 40 == 0:
            s.append(SID, [Whatever(what=f"w{i % 3}")])
            s.append_progress_entry(SID, make_entry(i))


@pytest.mark.parametrize("reader_knows", [True, False])
def test_a_snapshot_of_odd_projections_loads_like_the_log_it_replaced(
    tmp_path: Path, reader_knows: bool
) -> None:
    """Projections whose names need JSON escapes (quotes, backslashes, unicode line
    separators, control bytes, the very bytes that open the states), an empty state,
    a large one, custom events kept as unknown by a writer that does not know them:
    every load API on the compacted log (decoded by its layout: it is long) answers as
    on an uncompacted copy, cold and warm, also for a reader without the projections."""
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    kw: dict[str, Any] = {"event_types": [Whatever], "projections": _projections()}
    for r in (plain, packed):
        with SessionStore(r, **kw) as s:
            _write_history(s)
    # compacted by a writer that does not know the custom event (kept verbatim), then
    # by one that does; a few appends after
    with SessionStore(packed) as s:
        assert s.compact(SID, force=True).compacted
    with SessionStore(packed, **kw) as s:
        s.append_transcript_messages(SID, [Message(Role.USER, "between")])
        assert s.compact(SID, force=True).compacted
    with SessionStore(plain, **kw) as s:
        s.append_transcript_messages(SID, [Message(Role.USER, "between")])
    for r in (plain, packed):
        with SessionStore(r, **kw) as s:
            s.append(SID, [Whatever(what="late")])
    snap = log_path(packed, SID).read_bytes().split(b"\n", 1)[0]
    assert len(snap) > log_module.LONG_SNAPSHOT and b'"unknown":[' in snap
    read_kw = kw if reader_knows else {}
    with SessionStore(plain, **read_kw) as s:
        want = _everything(s)
    with SessionStore(packed, **read_kw) as s:
        got_cold = _everything(s)
        got_warm = _everything(s)
    for got in (got_cold, got_warm):
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == want[k], k
    assert want["empty"] in ({}, "unknown projection")


def test_the_memory_engine_and_the_async_store_agree_after_compaction(tmp_path: Path) -> None:
    import asyncio

    url = "memory://attack-hot-path"
    kw: dict[str, Any] = {"event_types": [Whatever]}
    with SessionStore(url, **kw) as mem, SessionStore(tmp_path / "f", **kw) as fs:
        for s in (mem, fs):
            _write_history(s)
            assert s.compact(SID, force=True).compacted
            s.append_transcript_messages(SID, [Message(Role.USER, "after")])
        assert _everything(mem) == _everything(fs)

    async def through_aio() -> tuple[Any, ...]:
        async with AsyncSessionStore(tmp_path / "f", **kw) as a:
            await a.append_transcript_messages(SID, [Message(Role.USER, "async")])
            await a.compact(SID, force=True)
            return (
                await a.load_transcript_messages(SID),
                await a.load_bootstrap_state(SID),
                await a.verify(SID),
            )

    msgs, boot, report = asyncio.run(through_aio())
    with SessionStore(tmp_path / "f", **kw) as cold:
        assert cold.load_transcript_messages(SID) == msgs
        assert cold.load_bootstrap_state(SID) == boot
    assert report.ok and msgs[-2:] == [Message(Role.USER, "after"), Message(Role.USER, "async")]


def test_changing_loaded_plain_messages_changes_no_other_message(root: Path) -> None:
    """The private copies of plain messages share one empty `blocks` list and one empty
    `metadata` dict (`codec._NO_BLOCKS`): a caller changing the messages a load gives it,
    by every way of loading, changes neither the store's state, nor the next load, nor
    the cache a cold load reads, nor the shared containers."""
    with SessionStore(root) as s:  # the creator: it keeps the transcript as it appends
        for i in range(3):
            s.append_transcript_messages(
                SID, [Message(Role.USER, f"p{i}"), Message(Role.ASSISTANT, f"a{i}")]
            )
        for page in every_transcript_load(s, SID):
            for m in page:
                m.blocks.append(TextBlock("meddled"))
                m.metadata["meddled"] = True
        # the shared containers are still empty: the next plain message copied holds them
        _, (stamped,), _ = EventCodec().encode_batch(
            [MessagesAppended(messages=[Message(Role.USER, "next")])], 1, "", TS, None, check=True
        )
        shared = stamped.messages[0]  # type: ignore[attr-defined]
        assert shared.blocks == [] and shared.metadata == {}
        again = s.load_transcript_messages(SID)
        assert all(not m.blocks and not m.metadata for m in again)
        assert [m.content for m in again] == ["p0", "a0", "p1", "a1", "p2", "a2"]
    with SessionStore(root) as cold:
        read = cold.load_transcript_messages(SID)
    assert read == again
    assert b"meddled" not in log_path(root, SID).read_bytes()
