"""Writes that must be judged against the session's state (update_feature_pass,
idempotency keys) are judged against the state this store left at its own head,
without reading the log, and the append is conditional on that head: another writer
that moved it makes the store read, judge again and retry. Attacked here with a second
store instance changing the session between two writes of the first, on every engine
that two instances can share."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_entry, make_features, make_manifest

from eventstore import SessionStore
from eventstore.errors import FeatureNotFoundError, InvalidRecordError
from eventstore.format.events import Event, ProgressAppended, Snapshot
from eventstore.records import FeatureRecord


def _feature(fid: str) -> FeatureRecord:
    return FeatureRecord(id=fid, category="c", description=fid, steps=["s"], passes=False)


def _pair(url: str) -> tuple[SessionStore, SessionStore]:
    a, b = SessionStore(url), SessionStore(url)
    a.initialize_session_if_missing("s", make_manifest("s"), [_feature("f1"), _feature("f2")])
    a.load_bootstrap_state("s")  # a's bootstrap fold is warm
    return a, b


def _count_reads(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = store.engine.read_some

    def read_some(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(store.engine, "read_some", read_some)
    return calls


def test_a_warm_update_reads_nothing(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair(url)
    with a, b:
        reads = _count_reads(a, monkeypatch)
        for _ in range(5):
            a.update_feature_pass("s", "f1", True)
            a.append_progress_entry("s", make_entry(0), idempotency_key=None)
        assert reads[0] == 0
        assert a.load_bootstrap_state("s").feature_list[0].passes is True


def test_a_feature_added_elsewhere_can_be_updated(url: str) -> None:
    a, b = _pair(url)
    with a, b:
        b.replace_feature_list("s", [_feature("f1"), _feature("f2"), _feature("new")])
        a.update_feature_pass("s", "new", True)  # a's cached state lacks it: read, retry
        assert [f.passes for f in b.load_bootstrap_state("s").feature_list] == [
            False,
            False,
            True,
        ]


def test_a_feature_removed_elsewhere_is_refused_and_nothing_is_written(url: str) -> None:
    a, b = _pair(url)
    with a, b:
        b.replace_feature_list("s", [_feature("f2")])
        seq = b.last_seq("s")
        with pytest.raises(FeatureNotFoundError):
            a.update_feature_pass("s", "f1", True)  # a's cached state still has it
        assert b.last_seq("s") == seq
        assert a.verify("s").ok


def test_a_key_remembered_from_a_replaced_log_does_not_replay(url: str) -> None:
    a, b = _pair(url)
    with a, b:
        first = a.append_progress_entry("s", make_entry(1), idempotency_key="k")
        again = a.append_progress_entry("s", make_entry(1), idempotency_key="k")
        assert again.replayed and again.first_seq == first.first_seq
        # another instance deletes the session and starts it again: the key is gone
        b.delete_session("s", purge=True)
        b.initialize_session_if_missing("s", make_manifest("s"), make_features(1))
        result = a.append_progress_entry("s", make_entry(1), idempotency_key="k")
        assert not result.replayed
        assert [p.summary for p in b.load_bootstrap_state("s").recent_progress] == ["step 1"]


def test_a_key_used_elsewhere_replays_here(url: str) -> None:
    a, b = _pair(url)
    with a, b:
        a.append_progress_entry("s", make_entry(0), idempotency_key="warm")  # a's keys warm
        done = b.append_progress_entry("s", make_entry(5), idempotency_key="k5")
        result = a.append_progress_entry("s", make_entry(5), idempotency_key="k5")
        assert result.replayed and result.first_seq == done.first_seq
        summaries = [p.summary for p in a.load_bootstrap_state("s").recent_progress]
        assert summaries.count("step 5") == 1


# -- append_decided: a caller's own decision, judged the same way --------------------------


def _progress_below(cap: int, i: int) -> Any:
    """A decision: a progress note while the session holds fewer than `cap`."""

    def decide(state: Any) -> list[Event]:
        return [ProgressAppended(entry=make_entry(i))] if len(state.recent_progress) < cap else []

    return decide


def test_a_warm_decided_append_reads_nothing(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair(url)
    with a, b:
        reads = _count_reads(a, monkeypatch)
        for i in range(5):
            result = a.append_decided("s", a.bootstrap, _progress_below(10, i))
            assert result is not None and not result.replayed
        assert reads[0] == 0
        assert len(b.load_bootstrap_state("s").recent_progress) == 5


def test_a_decision_is_made_again_on_what_another_writer_appended(url: str) -> None:
    """Broken, this appends a 3rd note: a's cached state holds 2, b appended the 3rd."""
    a, b = _pair(url)
    with a, b:
        for i in range(2):
            a.append_decided("s", a.bootstrap, _progress_below(3, i))
        b.append_progress_entry("s", make_entry(7))
        seq = b.last_seq("s")
        assert a.append_decided("s", a.bootstrap, _progress_below(3, 9)) is None
        assert b.last_seq("s") == seq
        assert a.verify("s").ok


def test_a_refusal_on_a_cached_state_is_judged_again_on_a_fresh_one(url: str) -> None:
    a, b = _pair(url)
    seen: list[int] = []

    def needs_new(state: Any) -> list[Event]:
        seen.append(len(state.feature_list))
        if not any(f.id == "new" for f in state.feature_list):
            raise FeatureNotFoundError("s", "new")
        return [ProgressAppended(entry=make_entry(1))]

    with a, b:
        b.replace_feature_list("s", [_feature("f1"), _feature("f2"), _feature("new")])
        assert a.append_decided("s", "bootstrap", needs_new) is not None
        assert seen == [2, 3]  # a's cached state, then the log's
        b.replace_feature_list("s", [_feature("f1")])
        with pytest.raises(FeatureNotFoundError):  # refused on the fresh state too
            a.append_decided("s", "bootstrap", needs_new)
        assert seen == [2, 3, 3, 1]
        assert [p.summary for p in b.load_bootstrap_state("s").recent_progress] == ["step 1"]


@pytest.mark.parametrize(
    "decided",
    [ProgressAppended(entry=make_entry(0)), [Snapshot(base_h="0")], [object()]],
    ids=["not a sequence", "a snapshot", "not an event"],
)
def test_a_decision_that_is_no_batch_is_refused_and_writes_nothing(url: str, decided: Any) -> None:
    a, b = _pair(url)
    with a, b:
        seq = b.last_seq("s")
        with pytest.raises(InvalidRecordError):
            a.append_decided("s", a.bootstrap, lambda state: decided)
        assert b.last_seq("s") == seq
