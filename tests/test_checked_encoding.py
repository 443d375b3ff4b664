"""The append hot path validates records as it encodes them (EventCodec.encode_batch
with check=True): one round trip of the whole event instead of one per record. It must
refuse exactly what `validated_copy` refuses, with the same error, write nothing, and
store a private copy of what it accepts."""

from __future__ import annotations

import enum
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import (
    log_path,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import aware_datetimes, messages, texts

from eventstore import (
    InvalidRecordError,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    SessionStore,
    TextBlock,
    ToolUseBlock,
)
from eventstore.format.codec import EventCodec, NotAsStoredError, validated_copy
from eventstore.format.events import Event, MessagesAppended, ProgressAppended

SID = "s"
NAIVE = datetime(2026, 1, 1, 12, 0)
TS = datetime(2026, 1, 2, tzinfo=UTC)

# records the hot path sees as exactly-typed (so it takes them) that must not be stored
BAD: dict[str, Callable[[SessionStore], object]] = {
    "role-a-str": lambda s: s.append_transcript_messages(
        SID,
        [Message(Role.USER, "ok"), Message("user", "x")],  # type: ignore[arg-type]
    ),
    "content-none": lambda s: s.append_transcript_messages(SID, [Message(Role.USER, None)]),  # type: ignore[arg-type]
    "lone-surrogate": lambda s: s.append_transcript_messages(SID, [Message(Role.USER, "a\ud800b")]),
    "naive-created-at": lambda s: s.append_transcript_messages(
        SID, [Message(Role.USER, "x", created_at=NAIVE)]
    ),
    "metadata-tuple": lambda s: s.append_transcript_messages(
        SID, [Message(Role.USER, "x", metadata={"k": (1, 2)})]
    ),
    "metadata-bytes": lambda s: s.append_transcript_messages(
        SID, [Message(Role.USER, "x", metadata={"k": b"raw"})]
    ),
    "metadata-object": lambda s: s.append_transcript_messages(
        SID, [Message(Role.USER, "x", metadata={"k": object()})]
    ),
    "blocks-none": lambda s: s.append_transcript_messages(
        SID,
        [Message(Role.USER, "x", blocks=None)],  # type: ignore[arg-type]
    ),
    "metadata-none": lambda s: s.append_transcript_messages(
        SID,
        [Message(Role.USER, "x", metadata=None)],  # type: ignore[arg-type]
    ),
    "blocks-a-tuple": lambda s: s.append_transcript_messages(
        SID,
        [Message(Role.USER, "x", blocks=())],  # type: ignore[arg-type]
    ),
    "name-an-int": lambda s: s.append_transcript_messages(
        SID,
        [Message(Role.USER, "x", name=3)],  # type: ignore[arg-type]
    ),
    "block-a-str": lambda s: s.append_transcript_messages(
        SID,
        [Message(Role.USER, "x", blocks=["text"])],  # type: ignore[list-item]
    ),
    "progress-run-id-int": lambda s: s.append_progress_entry(
        SID,
        ProgressEntry(run_id=7, summary="s"),  # type: ignore[arg-type]
    ),
    "progress-naive": lambda s: s.append_progress_entry(
        SID, ProgressEntry(run_id="r", summary="s", created_at=NAIVE)
    ),
    "checkpoint-bad-status": lambda s: s.record_run_checkpoint(
        SID,
        RunCheckpoint(run_id="r", status="done"),  # type: ignore[arg-type]
    ),
    "checkpoint-note-int": lambda s: s.record_run_checkpoint(
        SID,
        RunCheckpoint(run_id="r", note=3),  # type: ignore[arg-type]
    ),
}


def _keyed(write: Callable[[SessionStore], object]) -> Callable[[SessionStore], object]:
    """The same write with an idempotency key: records validated one by one, up front."""

    def call(s: SessionStore) -> object:
        orig = {
            name: getattr(s, name)
            for name in (
                "append_transcript_messages",
                "append_progress_entry",
                "record_run_checkpoint",
            )
        }

        class Keyed:
            def __getattr__(self, name: str) -> Any:
                return lambda *a, **k: orig[name](*a, idempotency_key="k", **k)

        return write(Keyed())  # type: ignore[arg-type]

    return call


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_hot_path_refuses_what_validation_refuses_with_the_same_error(
    store: SessionStore, name: str
) -> None:
    store.append_transcript_messages(SID, [Message(Role.USER, "first")])
    log = log_path(store.root, SID)
    before = log.read_bytes()
    with pytest.raises(InvalidRecordError) as fast:
        BAD[name](store)
    assert log.read_bytes() == before
    assert not isinstance(fast.value, NotAsStoredError)  # the error that names the field
    with pytest.raises(InvalidRecordError) as keyed:
        _keyed(BAD[name])(store)
    assert str(fast.value) == str(keyed.value)
    assert log.read_bytes() == before
    assert store.load_transcript_messages(SID) == [Message(Role.USER, "first")]


def test_what_the_hot_path_stores_is_a_private_copy(store: SessionStore) -> None:
    """Warm: the appended records are folded into the states the store keeps (loaded
    first, so they are at the head); changing the caller's records afterwards must not
    reach them, nor the log."""
    assert store.load_transcript_messages(SID) == []
    meta: dict[str, Any] = {"tags": ["a"]}
    blocks: list[Any] = [TextBlock("hello")]
    plain = Message(Role.ASSISTANT, "plain", name="bot")  # copied without a round trip
    given_msgs = [Message(Role.USER, "x", blocks=blocks, metadata=meta)]
    entry = ProgressEntry(run_id="r", summary="s")
    store.append_transcript_messages(SID, given_msgs)
    store.append_transcript_messages(SID, [plain])
    store.append_progress_entry(SID, entry)
    meta["tags"].append("b")
    blocks.append(TextBlock("changed"))
    given_msgs.append(Message(Role.USER, "late"))
    plain.blocks.append(TextBlock("added later"))
    plain.metadata["k"] = "added later"
    want = [
        Message(Role.USER, "x", blocks=[TextBlock("hello")], metadata={"tags": ["a"]}),
        Message(Role.ASSISTANT, "plain", name="bot"),
    ]
    assert store.load_transcript_messages(SID) == want
    assert store.load_bootstrap_state(SID).recent_progress == [entry]
    with SessionStore(store.root) as cold:
        assert cold.load_transcript_messages(SID) == want


def test_encode_batch_check_returns_decoded_copies_and_refuses_mismatches() -> None:
    codec = EventCodec()
    msg = Message(Role.USER, "x", metadata={"n": [1]})
    ev = MessagesAppended(messages=[msg])
    data, stamped, _ = codec.encode_batch([ev], 1, "", TS, None, check=True)
    plain, _, _ = codec.encode_batch([ev], 1, "", TS, None)
    assert data == plain
    got = stamped[0]
    assert isinstance(got, MessagesAppended) and got.messages == [msg]
    assert got.messages[0] is not msg and got.messages[0].metadata is not msg.metadata
    with pytest.raises(NotAsStoredError):
        codec.encode_batch(
            [MessagesAppended(messages=[Message("user", "x")])],  # type: ignore[arg-type]
            1,
            "",
            TS,
            None,
            check=True,
        )
    with pytest.raises(NotAsStoredError):
        codec.encode_batch(
            [ProgressAppended(entry=ProgressEntry("r", "s", created_at=NAIVE))],
            1,
            "",
            TS,
            None,
            check=True,
        )


_values = st.one_of(
    texts,
    st.integers(),
    st.booleans(),
    st.none(),
    st.lists(texts, max_size=2),
    st.tuples(texts),
    st.binary(max_size=3),
    st.sets(st.integers(), max_size=2),
    st.datetimes(),
    aware_datetimes,
    st.sampled_from(list(Role)),
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.one_of(
            messages,
            st.builds(
                Message,
                role=st.one_of(st.sampled_from(Role), texts),
                content=st.one_of(texts, st.integers()),
                name=st.one_of(st.none(), texts, st.integers()),
                blocks=st.one_of(st.just([]), st.none(), st.just(()), st.lists(texts, max_size=1)),
                metadata=st.one_of(st.dictionaries(texts, _values, max_size=2), st.none()),
                created_at=st.one_of(st.none(), st.datetimes(), aware_datetimes),
            ),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_one_round_trip_of_the_event_accepts_what_each_record_round_trip_accepts(
    msgs: list[Message],
) -> None:
    def per_record() -> bool:
        try:
            for i, m in enumerate(msgs):
                validated_copy(m, Message, f"messages[{i}]")
        except InvalidRecordError:
            return False
        return True

    try:
        EventCodec().encode_batch([MessagesAppended(messages=msgs)], 1, "", TS, None, check=True)
        whole = True
    except NotAsStoredError:
        whole = False
    assert whole == per_record()


def test_the_plain_message_fast_path_knows_every_field_of_a_message() -> None:
    """codec._plain_copies judges a message field by field without a round trip: a
    field added to Message must be judged there too (or the round trip take it)."""
    assert Message.__struct_fields__ == (
        "role",
        "content",
        "name",
        "blocks",
        "created_at",
        "metadata",
    ), "Message changed: update eventstore.format.codec._plain_copies"


# -- attacks -------------------------------------------------------------------------------


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
