"""The append hot path validates records as it encodes them (EventCodec.encode_batch
with check=True): one round trip of the whole event instead of one per record. It must
refuse exactly what `validated_copy` refuses, with the same error, write nothing, and
store a private copy of what it accepts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import log_path
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
)
from eventstore.format.codec import (
    EventCodec,
    NotAsStoredError,
    validated_copy,
)
from eventstore.format.events import (
    MessagesAppended,
    ProgressAppended,
)

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
