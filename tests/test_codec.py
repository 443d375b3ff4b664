"""The line codec: every record and every event type round-trips; the hash chain holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import LOGS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import (
    aware_datetimes,
    bootstrap_states,
    builtin_events,
    checkpoints,
    feature_lists,
    features,
    init_plans,
    manifests,
    messages,
    payload_events,
    progress_entries,
    snapshots,
)

from eventstore import (
    Event,
    FeaturePassUpdated,
    FeatureRecord,
    InitCommand,
    InitShellScript,
    InvalidRecordError,
    Message,
    MessagesAppended,
    NestingTooDeepError,
    ProgressEntry,
    Role,
    RunCheckpoint,
    SessionManifest,
    SessionStore,
    Snapshot,
)
from eventstore.format.chain import (
    line_hash,
    link_of,
    split_hash,
)
from eventstore.format.codec import EventCodec
from eventstore.format.depth import MAX_DEPTH, depth_of, shallow
from eventstore.format.events import (
    CheckpointRecorded,
    FeatureListReplaced,
    LabelsSet,
    LineHead,
    ManifestSet,
    ProgressAppended,
    SessionDeleted,
)
from eventstore.format.reader import read_lines
from eventstore.records import (
    BootstrapState,
    InitPlan,
)

SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
TS = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

CODEC = EventCodec()
FULL = CODEC.decoder()


def _parse(data: bytes) -> tuple[list[Event], int]:
    """The events of `data` read as a whole log by the line reader, and the bytes read."""
    lines = read_lines(data, CODEC, FULL, "test.jsonl")
    return lines.events, lines.end


def _lines(data: bytes) -> list[bytes]:
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


# -- records ---------------------------------------------------------------------------

RECORDS = [
    (FeatureRecord, features),
    (ProgressEntry, progress_entries),
    (RunCheckpoint, checkpoints),
    (InitPlan, init_plans),
    (SessionManifest, manifests()),
    (Message, messages),
    (BootstrapState, bootstrap_states),
    (list[FeatureRecord], feature_lists),
]


@pytest.mark.parametrize(("cls", "strategy"), RECORDS, ids=lambda x: getattr(x, "__name__", ""))
def test_record_round_trips_through_json(cls: type, strategy: st.SearchStrategy) -> None:
    """Every record encodes to JSON and decodes back equal, aware timestamps included."""

    @SETTINGS
    @given(strategy)
    def check(value: object) -> None:
        data = msgspec.json.encode(value)
        data.decode("utf-8")  # valid UTF-8, readable by jq
        assert msgspec.json.decode(data, type=cls) == value

    check()


@SETTINGS
@given(init_plans)
def test_init_plan_steps_keep_their_kind(plan: InitPlan) -> None:
    """Both step kinds survive a round trip as themselves, in order."""
    back = msgspec.json.decode(msgspec.json.encode(plan), type=InitPlan)
    assert [type(s) for s in back.steps] == [type(s) for s in plan.steps]
    assert all(isinstance(s, InitCommand | InitShellScript) for s in back.steps)


@SETTINGS
@given(aware_datetimes)
def test_aware_datetime_keeps_instant_and_offset(when: datetime) -> None:
    """A timestamp with any whole-minute offset reads back as the same instant and offset."""
    entry = ProgressEntry(run_id="r", summary="s", created_at=when)
    back = msgspec.json.decode(msgspec.json.encode(entry), type=ProgressEntry)
    assert back.created_at == when
    assert back.created_at.utcoffset() == when.utcoffset()


# -- events through the line codec -----------------------------------------------------


def _check_chain(data: bytes, stamped: list[Event], link: str) -> str:
    """Every line ends with its hash, which chains it to the previous line's link."""
    for line, ev in zip(_lines(data), stamped, strict=True):
        split = split_hash(line)
        assert split is not None, line
        body, h = split
        assert h == ev.h
        assert len(h) == 16 and int(h, 16) >= 0
        assert line_hash(link, body) == h
        assert line.endswith(b',"h":"' + h.encode() + b'"}')
        link = link_of(ev)
    return link


@SETTINGS
@given(
    events=st.lists(payload_events, min_size=1, max_size=5),
    first_seq=st.integers(min_value=1, max_value=2**40),
    link=st.sampled_from(["", "0123456789abcdef"]),
    key=st.none() | st.text(min_size=1, max_size=8),
)
def test_event_batch_round_trips(
    events: list[Event], first_seq: int, link: str, key: str | None
) -> None:
    """A batch of any built-in events decodes back to exactly the stamped events; `more`
    counts down, the key sits on the first line only, and the hash chain holds."""
    data, stamped, new_link = CODEC.encode_batch(events, first_seq, link, TS, key)
    assert data.count(b"\n") == len(events)
    decoded = FULL.decode_lines(data)
    assert decoded == stamped
    for i, (ev, orig) in enumerate(zip(decoded, events, strict=True)):
        assert type(ev) is type(orig)
        assert ev.seq == first_seq + i
        assert ev.more == len(events) - 1 - i
        assert ev.key == (key if i == 0 else None)
        assert ev.ts == TS
        # the payload is the caller's
        assert msgspec.structs.replace(ev, seq=0, ts=orig.ts, more=0, key=None, h="") == orig
    assert _check_chain(data, stamped, link) == new_link
    # the slow exact path agrees line by line, and every envelope is readable alone
    for line, ev in zip(_lines(data), stamped, strict=True):
        assert CODEC.decode_line(line, 0, "x") == ev
        head = msgspec.json.decode(line, type=LineHead)
        assert (head.type, head.seq, head.more, head.key, head.h) == (
            ev.__struct_config__.tag,
            ev.seq,
            ev.more,
            ev.key,
            ev.h,
        )


@SETTINGS
@given(snap=snapshots(), rest=st.lists(payload_events, max_size=4), seq=st.integers(1, 10**6))
def test_log_parse_round_trips_snapshot_then_events(
    snap: Snapshot, rest: list[Event], seq: int
) -> None:
    """A log starting with a snapshot (as compaction writes it) parses back to the stamped
    events; lines after it chain to the snapshot's `base_h`."""
    # compaction chains a snapshot's own h to its base_h (the link of the line it covers)
    data, stamped, _ = CODEC.encode_batch([snap], seq, snap.base_h, TS, None)
    assert link_of(stamped[0]) == snap.base_h
    more, stamped2, link = CODEC.encode_batch(rest, seq + 1, snap.base_h, TS, None)
    data += more
    events, end = _parse(data)
    assert end == len(data)
    assert events == stamped + stamped2
    _check_chain(data, stamped + stamped2, snap.base_h)


@SETTINGS
@given(batches=st.lists(st.lists(payload_events, min_size=1, max_size=3), min_size=1, max_size=4))
def test_log_parse_of_several_batches(batches: list[list[Event]]) -> None:
    """Consecutive batches parse back in order with gapless sequence numbers."""
    data = b""
    link = ""
    seq = 1
    expected: list[Event] = []
    for batch in batches:
        chunk, stamped, link = CODEC.encode_batch(batch, seq, link, TS, None)
        data += chunk
        expected += stamped
        seq += len(batch)
    events, end = _parse(data)
    assert events == expected
    assert end == len(data)
    assert [e.seq for e in events] == list(range(1, seq))


@SETTINGS
@given(events=st.lists(builtin_events, min_size=1, max_size=4))
def test_encode_unhashed_round_trips(events: list[Event]) -> None:
    """Unstamped events (export form) decode back to themselves, snapshots included."""
    for ev in events:
        assert FULL.decode(CODEC.encode_unhashed(ev)) == ev


@SETTINGS
@given(when=aware_datetimes, seq=st.integers(1, 1000))
def test_append_time_with_offset_round_trips(when: datetime, seq: int) -> None:
    """The append time stamped on a line reads back as the same instant."""
    ev = FeaturePassUpdated(feature_id="x", passes=True)
    data, _, _ = CODEC.encode_batch([ev], seq, "", when, None)
    assert FULL.decode_lines(data)[0].ts == when


def test_bootstrap_decoder_stubs_messages() -> None:
    """The bootstrap decoder keeps every envelope but never materializes message payloads."""
    from projections import BootstrapProjection

    msg = MessagesAppended(messages=[Message(role=Role.USER, content="x")])
    data, stamped, _ = CODEC.encode_batch([msg], 1, "", TS, "k")
    (ev,) = CODEC.decoder(BootstrapProjection.event_types).decode_lines(data)
    assert (ev.seq, ev.key, ev.h) == (1, "k", stamped[0].h)
    assert not isinstance(ev, MessagesAppended)
    assert not hasattr(ev, "messages")


PAYLOAD_TAGS = sorted(
    c.__struct_config__.tag  # type: ignore[misc]
    for c in (ManifestSet, FeatureListReplaced, FeaturePassUpdated, ProgressAppended,
              CheckpointRecorded, MessagesAppended)
)  # fmt: skip


def _seen(ev: Event) -> Any:
    """What a fold sees of a decoded event: a needed one whole, a stub by its envelope
    (stub classes are each codec's own)."""
    if getattr(type(ev), "SKIPPED", False):
        return (ev.seq, ev.ts, ev.more, ev.key, ev.v, ev.h)
    return ev


@SETTINGS
@given(
    regions=st.lists(st.lists(payload_events, min_size=1, max_size=4), min_size=1, max_size=4),
    needed=st.sets(st.sampled_from(PAYLOAD_TAGS), min_size=1),
    opened=st.booleans(),
    ended=st.booleans(),
)
def test_a_needed_types_decoder_decodes_alike_before_and_after_other_types_come(
    regions: list[list[Event]], needed: set[str], opened: bool, ended: bool
) -> None:
    """A decoder of some types decodes only those until another type's line comes (its
    stubs made then), and a snapshot (`opened`: the log's first line) and a tombstone
    (`ended`: its last) whole whenever they come: the events are the same as from one
    that made its stubs first."""
    if opened:
        regions[0].insert(0, Snapshot(base_h="0" * 64, states={}))
    if ended:
        regions[-1].append(SessionDeleted(by="test", last_seq=1))
    datas = []
    seq = 1
    for events in regions:
        data, _, _ = CODEC.encode_batch(events, seq, "", TS, None)
        datas.append(data)
        seq += len(events)
    fresh, warmed = EventCodec(), EventCodec()
    other = (
        MessagesAppended(messages=[]) if "messages_appended" not in needed else LabelsSet(labels={})
    )
    warmed.decoder(frozenset(needed)).decode_lines(CODEC.encode_batch([other], 1, "", TS, None)[0])
    whole = needed | {"snapshot", "session_deleted"}
    for data in datas:
        got = fresh.decoder(frozenset(needed)).decode_lines(data)
        want = warmed.decoder(frozenset(needed)).decode_lines(data)
        assert [_seen(e) for e in got] == [_seen(e) for e in want]
        for ev in got:
            assert getattr(type(ev), "SKIPPED", False) != (type(ev).__struct_config__.tag in whole)  # type: ignore[attr-defined]


def test_golden_log_hash_chain_and_round_trip() -> None:
    """The golden complete log decodes fully, chains from the empty link, and re-encodes
    byte for byte."""
    data = (LOGS / "complete.jsonl").read_bytes()
    events, end = _parse(data)
    assert end == len(data)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    _check_chain(data, events, "")
    # re-encoding each batch from the decoded events gives the same bytes
    out = b""
    link = ""
    batch: list[Event] = []
    for ev in events:
        batch.append(ev)
        if ev.more == 0:
            chunk, _, link = CODEC.encode_batch(
                batch, batch[0].seq, link, batch[0].ts, batch[0].key
            )
            out += chunk
            batch = []
    assert out == data


def test_offset_with_seconds_is_kept_or_rejected(tmp_path: Path) -> None:
    """A timestamp whose offset has seconds (legal in Python, e.g. LMT zones) is either
    stored exactly or refused, never silently moved in time."""
    from eventstore import (
        InvalidRecordError,
        SessionStore,
    )

    odd = timezone(timedelta(minutes=19, seconds=32))  # Europe/Amsterdam LMT
    when = datetime(1900, 6, 1, 12, 0, tzinfo=odd)
    with SessionStore(tmp_path / "s") as store:
        try:
            store.append_progress_entry(
                "s", ProgressEntry(run_id="r", summary="x", created_at=when)
            )
        except InvalidRecordError:
            return
        got = SessionStore(tmp_path / "s").load_bootstrap_state("s").recent_progress[0]
        assert got.created_at == when


# -- nesting depth ---------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


def _reference_depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_reference_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_reference_depth, value.values()), default=0)
    return 0


@settings(max_examples=150)
@given(_json_values)
def test_depth_of_counts_nesting_not_brackets_in_strings(value: object) -> None:
    """`depth_of` (no recursion) agrees with the nesting a decoder recurses into, whatever
    brackets, quotes and backslashes strings hold; `shallow` keeps the top-level fields."""
    data = msgspec.json.encode(value)
    assert depth_of(data) == _reference_depth(value)
    if isinstance(value, dict):
        flat = msgspec.json.decode(shallow(data))
        assert flat.keys() == value.keys()
        assert all(flat[k] == (0 if isinstance(v, (list, dict)) else v) for k, v in value.items())


def test_brackets_in_text_are_no_nesting(tmp_path: Path) -> None:
    """Text full of brackets is stored however many it holds: only nesting counts."""
    with SessionStore(tmp_path / "store") as s:
        m = Message(Role.USER, "[{" * 5000, metadata={"k": "]]" * 5000, "[": ["{" * 300]})
        s.append_transcript_messages("s", [m])
        assert s.load_transcript_messages("s") == [m]


class Deep(Event, tag="deep_thing", kw_only=True):
    payload: object = None


def test_a_batch_with_one_event_too_deep_is_refused_whole(tmp_path: Path) -> None:
    """One over-deep event refuses its whole batch (custom events too), nothing written;
    so does a value far too deep for the encoder's recursion."""
    deep = _nested_lists(MAX_DEPTH)  # its line, one level more
    with SessionStore(tmp_path / "store", event_types=[Deep]) as s:
        s.append("s", [Deep(payload=1)])
        for payload in (deep, _nested_lists(5000)):
            with pytest.raises(NestingTooDeepError, match=f"at most {MAX_DEPTH}"):
                s.append("s", [Deep(payload=2), Deep(payload=payload)])
        assert s.last_seq("s") == 1
        s.append("s", [Deep(payload=deep[0])])  # one level less: at the limit
        assert [e.payload for e in s.read_events("s")][1] == deep[0]  # type: ignore[attr-defined]


def _nested_lists(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


class Verbatim(Event, tag="verbatim", kw_only=True):
    payload: msgspec.Raw = msgspec.Raw(b"null")


@pytest.mark.parametrize(
    "raw",
    [b"[1,\n2]", b'{"a":\n1}', b'"\\"[[[', b"[1]]", b"1 ]", b"[" * 300 + b"]" * 300],
    ids=["newline-in-array", "newline-in-object", "open-string", "extra-bracket", "stray", "deep"],
)
def test_a_raw_payload_that_is_no_single_json_line_is_refused_and_nothing_written(
    tmp_path: Path, raw: bytes
) -> None:
    """A `msgspec.Raw` field is written verbatim: one holding a newline (valid JSON) or
    no JSON at all is refused with an InvalidRecordError, nothing written, and the log
    reads on (0.1.0: a Raw with a newline was acknowledged and split its line in two, the
    log unreadable from there; invalid JSON raised a bare msgspec.DecodeError)."""
    with SessionStore(tmp_path / "store", event_types=[Verbatim]) as s:
        s.append("s", [Verbatim(payload=msgspec.Raw(b'"[\\"]"'))])
        with pytest.raises(InvalidRecordError):
            s.append("s", [Verbatim(payload=msgspec.Raw(raw))])
        s.append("s", [Verbatim(payload=msgspec.Raw(b"[1, 2]"))])
    with SessionStore(tmp_path / "store", event_types=[Verbatim]) as s:
        got = [bytes(e.payload) for e in s.read_events("s")]  # type: ignore[attr-defined]
        assert got == [b'"[\\"]"', b"[1, 2]"] and s.verify("s").ok
