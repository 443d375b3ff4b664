"""Incremental catch-up: a store folds only what was appended since its last load (by it
or another process), and loading the bootstrap state never materializes messages."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import (
    LOGS,
    FlipCounted,
    FlipsPerRun,
    log_path,
    make_checkpoint,
    make_entry,
    make_features,
    make_manifest,
)

import eventstore.core.fold_loop as fold_loop_module
import eventstore.core.folding as folding_module
import eventstore.core.session_core as core_module
import eventstore.engines.file.engine as file_engine
from eventstore import (
    BootstrapState,
    Message,
    MessagesAppended,
    ProgressEntry,
    Role,
    SessionStore,
)
from eventstore.format.codec import EventCodec
from eventstore.format.events import Event, ProgressAppended
from projections import (
    BootstrapProjection,
    TranscriptProjection,
    fold,
)
from projections.base import StructProjection

COMPLETE = (LOGS / "complete.jsonl").read_bytes()


class Spy:
    """Records what the store folds and which byte ranges of the log it reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
        self.folded: list[tuple[str, int]] = []
        self.reads: list[tuple[int, int]] = []  # (offset, length) of reads of `log`
        self.read_events: list[Any] = []
        real_fold = core_module.fold
        real_pread = file_engine.pread_all
        real_read_lines = fold_loop_module.read_lines

        def spy_fold(proj: Any, state: Any, events: Any) -> Any:
            events = list(events)
            self.folded.append((proj.name, len(events)))
            return real_fold(proj, state, events)

        def spy_pread(fd: int, n: int, offset: int) -> bytes:
            data = real_pread(fd, n, offset)
            self.reads.append((offset, len(data)))
            return data

        def spy_read_lines(*args: Any, **kwargs: Any) -> Any:
            res = real_read_lines(*args, **kwargs)
            self.read_events.extend(res.events)
            return res

        # the core folds its own appends with `fold`, and what it reads with
        # core.folding.fold_events, which calls `fold` there
        monkeypatch.setattr(core_module, "fold", spy_fold)
        monkeypatch.setattr(folding_module, "fold", spy_fold)
        monkeypatch.setattr(file_engine, "pread_all", spy_pread)
        monkeypatch.setattr(fold_loop_module, "read_lines", spy_read_lines)
        self.log = log

    def clear(self) -> None:
        self.folded.clear()
        self.reads.clear()
        self.read_events.clear()

    def events_folded(self, name: str) -> int:
        return sum(n for p, n in self.folded if p == name)


def _setup(root: Path) -> SessionStore:
    store = SessionStore(root)
    store.initialize_session_if_missing("s", make_manifest("s"), make_features(4), make_entry(0))
    for i in range(1, 6):
        store.append_progress_entry("s", make_entry(i))
    store.append_transcript_messages("s", [Message(role=Role.USER, content="hello")])
    return store


def test_other_store_appends_are_folded_incrementally(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After another store instance appends, the next load reads exactly the new bytes
    and folds exactly the new events."""
    writer = _setup(root)
    reader = SessionStore(root)
    path = log_path(root, "s")
    spy = Spy(monkeypatch, path)
    first = reader.load_bootstrap_state("s")
    assert spy.events_folded("bootstrap") == 9  # 3 init + 5 progress + 1 message envelope
    size = path.stat().st_size

    spy.clear()
    writer.append_progress_entry("s", make_entry(6))
    writer.update_feature_pass("s", "f2", True)
    writer.record_run_checkpoint("s", make_checkpoint())
    added = path.stat().st_size - size
    spy.clear()
    state = reader.load_bootstrap_state("s")
    assert spy.folded == [("bootstrap", 3)]
    assert spy.reads == [(size, added)]
    assert state.recent_progress == [*first.recent_progress, make_entry(6)]
    assert [f.passes for f in state.feature_list] == [False, True, False, False]
    assert state.checkpoints == [make_checkpoint()]

    spy.clear()  # nothing new: nothing folded, no bytes read
    assert reader.load_bootstrap_state("s") == state
    assert spy.events_folded("bootstrap") == 0
    assert all(n == 0 for off, n in spy.reads if off)


def test_own_appends_need_no_reread(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store's own append is folded into its cache from the stamped events: the next
    load reads no log bytes and folds nothing more."""
    store = _setup(root)
    store.load_bootstrap_state("s")
    path = log_path(root, "s")
    spy = Spy(monkeypatch, path)
    store.append_progress_entry("s", make_entry(9))
    folded_by_write = spy.events_folded("bootstrap")
    spy.clear()
    state = store.load_bootstrap_state("s")
    assert folded_by_write == 1
    assert spy.events_folded("bootstrap") == 0
    assert sum(n for _, n in spy.reads) == 0
    assert state.recent_progress[-1] == make_entry(9)


class _TypesSeen(StructProjection[list[str]]):
    """The class name of every event `apply` was given (it reads progress entries)."""

    name, version, state_type = "types_seen", 1, list[str]
    event_types = frozenset({"progress_appended"})

    def initial(self) -> list[str]:
        return []

    def apply(self, state: list[str], event: Event) -> list[str]:
        state.append(type(event).__name__)
        return state


class _TypesSeenShared(_TypesSeen):
    name = "types_seen_shared"
    changes_events = False


def test_a_projection_that_never_changes_an_event_folds_the_appended_ones(root: Path) -> None:
    """A writer folds a projection that says `changes_events = False` the events it
    appended (every type decoded); any other user projection a decode of the written
    bytes of its own (the types it does not read as bare envelopes)."""
    with SessionStore(root, projections=[_TypesSeen(), _TypesSeenShared()]) as store:
        store.append_progress_entry("s", make_entry(0))
        store.load("s", "types_seen")
        store.load("s", "types_seen_shared")  # both folded: the next append advances them
        store.append_transcript_messages("s", [Message(Role.USER, "hi")])
        assert store.load("s", "types_seen_shared")[-1] == "MessagesAppended"
        assert store.load("s", "types_seen")[-1] != "MessagesAppended"


class _TypesSeenIgnoring(_TypesSeen):
    """`_TypesSeen` saying `ignores_other_types` (which its `apply` does not keep: what
    it was given shows which batches a writer folded into it)."""

    name = "types_seen_ignoring"
    ignores_other_types = True


def test_a_writer_skips_a_state_that_ignores_what_a_batch_holds(root: Path) -> None:
    """A writer folds a batch into a projection that says `ignores_other_types = True`
    only when the batch holds a type it reads (or a snapshot, or a tombstone): a
    transcript append passes it by, a progress entry reaches it; a projection that does
    not say so is given every event."""
    with SessionStore(root, projections=[_TypesSeen(), _TypesSeenIgnoring()]) as store:
        store.append_progress_entry("s", make_entry(0))
        assert store.load("s", "types_seen_ignoring") == ["ProgressAppended"]
        assert store.load("s", "types_seen") == ["ProgressAppended"]
        store.append_transcript_messages("s", [Message(Role.USER, "hi")])
        store.append_progress_entry("s", make_entry(1))
        assert store.load("s", "types_seen_ignoring") == ["ProgressAppended"] * 2
        assert len(store.load("s", "types_seen")) == 3
        store.delete_session("s")  # a tombstone: every state starts over from it
        assert store.load("s", "types_seen_ignoring") == store.load("s", "types_seen")


class _FlipsIgnoring(FlipsPerRun):
    name = "flips_ignoring"
    ignores_other_types = True


def test_a_store_that_learns_a_type_folds_it_into_a_state_that_ignores_others(
    root: Path,
) -> None:
    """The types a state that says `ignores_other_types` reads are known again when the
    store learns: a projection given before the type it reads was registered is folded
    the type's batches once the store learned it."""
    with SessionStore(root, projections=[_FlipsIgnoring()]) as store:
        store.append_progress_entry("s", make_entry(0))
        assert store.learn([FlipCounted], [])
        assert store.load("s", "flips_ignoring") == {}
        store.append("s", [FlipCounted(run_id="r")])
        store.append_transcript_messages("s", [Message(Role.USER, "hi")])
        assert store.load("s", "flips_ignoring") == {"r": 1}
    with SessionStore(root, event_types=[FlipCounted], projections=[_FlipsIgnoring()]) as cold:
        assert cold.load("s", "flips_ignoring") == {"r": 1}


def test_transcript_catch_up_is_independent(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each projection keeps its own position: loading the transcript after several loads
    of the bootstrap state folds the whole log once for the transcript, then only news."""
    writer = _setup(root)
    reader = SessionStore(root)
    spy = Spy(monkeypatch, log_path(root, "s"))
    reader.load_bootstrap_state("s")
    reader.load_bootstrap_state("s")
    assert spy.events_folded("transcript") == 0
    assert reader.load_transcript_messages("s") == [Message(role=Role.USER, content="hello")]
    assert spy.events_folded("transcript") == 9
    writer.append_transcript_messages("s", [Message(role=Role.ASSISTANT, content="hi")])
    spy.clear()
    assert len(reader.load_transcript_messages("s")) == 2
    assert spy.folded == [("transcript", 1)]


def _walk(obj: Any) -> Iterator[Any]:
    """Every object reachable through struct fields, lists, tuples and dicts."""
    yield obj
    if isinstance(obj, msgspec.Struct):
        for name in obj.__struct_fields__:
            yield from _walk(getattr(obj, name))
    elif isinstance(obj, list | tuple):
        for x in obj:
            yield from _walk(x)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(k)
            yield from _walk(v)


def test_bootstrap_load_never_builds_messages(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything the log read produced for the bootstrap state is inspected: no Message
    object and no message text in it; the transcript load (the control) does build them."""
    store = _setup(root)
    secret = "transcript text " * 50
    store.append_transcript_messages(
        "s", [Message(role=Role.ASSISTANT, content=secret + str(i)) for i in range(20)]
    )
    spy = Spy(monkeypatch, log_path(root, "s"))
    cold = SessionStore(root)
    state = cold.load_bootstrap_state("s")
    assert state.manifest is not None
    envelopes = [e for e in spy.read_events if e.__struct_config__.tag == "messages_appended"]
    assert len(envelopes) == 2  # both message events were read, as bare envelopes
    objs = list(_walk(spy.read_events))
    assert not any(isinstance(o, Message | MessagesAppended) for o in objs)
    assert not any(isinstance(o, str) and secret in o for o in objs)

    spy.clear()  # control: the same spy sees the transcript's messages
    assert len(cold.load_transcript_messages("s")) == 21
    objs = list(_walk(spy.read_events))
    assert sum(isinstance(o, Message) for o in objs) == 21


@pytest.mark.slow
def test_reader_catches_up_from_any_cut(tmp_path: Path) -> None:
    """A reader that loaded while the log ended at any byte (mid-line, mid-batch) folds the
    rest exactly once when the writer finishes: its state equals a cold load's."""
    decoder = EventCodec().decoder()
    events = [decoder.decode(line) for line in COMPLETE.splitlines()]
    full = fold(BootstrapProjection(), BootstrapState(), events)
    transcript = fold(TranscriptProjection(), [], events)
    root = tmp_path / "store"
    SessionStore(root).close()
    path = log_path(root, "golden")
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    for k in range(0, len(COMPLETE) + 1, 7):
        with open(path, "wb") as f:
            f.write(COMPLETE[:k])
        reader = SessionStore(root)
        reader.load_bootstrap_state("golden")
        reader.load_transcript_messages("golden")
        with open(path, "ab") as f:
            f.write(COMPLETE[k:])
        assert reader.load_bootstrap_state("golden") == full, k
        assert reader.load_transcript_messages("golden") == transcript, k
        assert reader.last_seq("golden") == len(events)


# -- attacks: folds interrupted or failing never leave a doubled cached state --------------


class _Interrupted(BaseException):
    """What a KeyboardInterrupt (or a timeout raised by a signal handler) is."""


class _Flaky(StructProjection[list[str]]):
    """Progress summaries; `fail_at` names a summary whose fold is interrupted once
    (after the state was changed in place, as `apply` may do)."""

    name = "flaky"
    version = 1
    event_types = frozenset({"progress_appended"})
    state_type = list[str]

    def __init__(self) -> None:
        self.fail_at: str | None = None
        self.error: type[BaseException] = _Interrupted

    def initial(self) -> list[str]:
        return []

    def apply(self, state: list[str], event: Event) -> list[str]:
        if isinstance(event, ProgressAppended):
            state.append(event.entry.summary)
            if event.entry.summary == self.fail_at:
                self.fail_at = None
                raise self.error
        return state


def _batch(*summaries: str) -> list[Event]:
    return [ProgressAppended(entry=ProgressEntry("r", s)) for s in summaries]


@pytest.mark.usefixtures("fast_switches")
def test_an_append_whose_cache_fold_is_interrupted_never_doubles_the_cached_state(
    tmp_path: Path,
) -> None:
    """`_write` advances every cached fold by the batch it committed, in place
    (`f.state = fold(...)`, then `f.head = new`). Interrupted in the middle of that
    (the append is committed), the state keeps the batch's first events while its
    head stays before the batch; the next load folds the batch from the log onto it
    again: ['a', 'b0', 'b1', 'b0', 'b1', 'b2'] for the log's a, b0, b1, b2."""
    flaky = _Flaky()
    store = SessionStore(tmp_path, projections=[flaky])
    try:
        store.append_progress_entry("s", ProgressEntry("r", "a"))
        assert store.load("s", "flaky") == ["a"]
        flaky.fail_at = "b1"
        with pytest.raises(_Interrupted):
            store.append("s", _batch("b0", "b1", "b2"))
        assert store.last_seq("s") == 4  # committed before the fold was interrupted
        assert store.load("s", "flaky") == ["a", "b0", "b1", "b2"]
    finally:
        store.close()


@pytest.mark.usefixtures("fast_switches")
def test_a_load_whose_fold_is_interrupted_never_doubles_the_cached_state(
    tmp_path: Path,
) -> None:
    """The same in a load (`_catch_up` / `_fold_pieces`): a fold interrupted inside a
    piece keeps what it changed in place while `f.head` stays where the piece began
    (only a fold checked against a checked prefix is reset), so the next load folds
    the piece again onto the half-folded state."""
    with SessionStore(tmp_path) as s:
        s.append("s", _batch("a"))
        s.append("s", _batch("b0", "b1", "b2"))
    flaky = _Flaky()
    store = SessionStore(tmp_path, projections=[flaky])
    try:
        assert store.load("s", "flaky") == ["a", "b0", "b1", "b2"]
        with SessionStore(tmp_path) as other:  # another writer: this store's load folds it
            other.append("s", _batch("c0", "c1"))
        flaky.fail_at = "c1"
        with pytest.raises(_Interrupted):
            store.load("s", "flaky")
        assert store.load("s", "flaky") == ["a", "b0", "b1", "b2", "c0", "c1"]
    finally:
        store.close()


@pytest.mark.usefixtures("fast_switches")
def test_an_append_whose_cache_fold_raises_returns_and_the_next_load_folds_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A projection's error while an append advances the cached folds comes after the
    batch is committed: raising it would make the caller write the batch again. The
    append returns (with a warning), the half-folded state is dropped, and the next load
    folds the log again (where the projection's error, if it recurs, belongs)."""
    flaky = _Flaky()
    flaky.error = ValueError
    store = SessionStore(tmp_path, projections=[flaky])
    try:
        assert store.load("s", "flaky") == []
        flaky.fail_at = "b1"
        with caplog.at_level(logging.WARNING, logger="eventstore"):
            result = store.append("s", _batch("b0", "b1", "b2"))
        assert (result.first_seq, result.last_seq) == (1, 3)
        assert "folding 's' into 'flaky' failed" in caplog.text
        assert store.load("s", "flaky") == ["b0", "b1", "b2"]
        assert store.last_seq("s") == 3  # written once
    finally:
        store.close()
