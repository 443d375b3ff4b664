"""A stateful model test: random sequences of the ten session operations, `append` with
an expected sequence number and idempotency keys, compaction (with and without an
archive, with and without retention), automatic compaction, `state_at`, forks, session
removal (tombstones, purges, restores), retention policies applied by `gc`, and
reopening, on two store instances sharing one store, against a tiny reference model of
the contract. State, transcript, sequence and history are compared after every step.
It runs on every engine of `tests/engines.py`."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from engines import ENGINES, EngineCase
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from strategies import checkpoints, feature_lists, manifests, messages, progress_entries, texts

from eventstore import (
    AutoCompact,
    BootstrapState,
    ConcurrencyError,
    FeatureNotFoundError,
    FeatureRecord,
    HistoryUnavailableError,
    IdempotencyConflictError,
    Message,
    Policy,
    ProgressAppended,
    ProgressEntry,
    RunCheckpoint,
    SessionDeletedError,
    SessionExistsError,
    SessionManifest,
    SessionStore,
    StoreClosedError,
    UnknownSessionError,
)
from projections import Retention

pytestmark = pytest.mark.slow  # a stateful hypothesis model on every engine

SIDS = ["plain-1", "ünïcødé セッション", "nested/a/../b"]


@dataclass
class Ref:
    """The contract, in memory: what one session must read back as."""

    manifest: SessionManifest | None = None
    features: list[FeatureRecord] = field(default_factory=list)
    progress: list[ProgressEntry] = field(default_factory=list)
    checkpoints: list[RunCheckpoint] = field(default_factory=list)
    transcript: list[Message] = field(default_factory=list)
    seq: int = 0  # events written: refused operations write none
    # idempotency key -> (first seq, last seq) and the request: (run_id, summary) per entry
    keys: dict[str, tuple[tuple[int, int], list[tuple[str, str]]]] = field(default_factory=dict)
    # events a compaction without archive may have dropped (an earlier archive may hold them)
    dropped: set[int] = field(default_factory=set)
    # what state_at(seq) must give; None inside a batch (not modelled), GONE where a
    # compaction without an archive dropped it
    history: dict[int, tuple[BootstrapState, list[Message]] | str | None] = field(
        default_factory=dict
    )
    # the state the history continues from (trimmed only by a compaction without archive)
    hist_progress: list[ProgressEntry] = field(default_factory=list)
    hist_checkpoints: list[RunCheckpoint] = field(default_factory=list)
    hist_transcript: list[Message] = field(default_factory=list)
    archived_upto: int = 0  # the last seq a compaction with an archive kept
    # a retention dropped something from the state (then every later snapshot, folded
    # from that one, is trimmed too), and such a snapshot stands in for history no
    # archive holds: no state_at at or after it is exact, so every one is GONE
    trimmed: bool = False
    trimmed_stand_in: bool = False
    compacted_at: int = -1  # the seq of the last compaction (its log is a lone snapshot)
    deleted: bool = False  # a tombstone ends the log: every write is refused

    def state(self) -> BootstrapState:
        return BootstrapState(
            manifest=self.manifest,
            feature_list=list(self.features),
            recent_progress=list(self.progress),
            checkpoints=list(self.checkpoints),
        )

    def hist_state(self) -> tuple[BootstrapState, list[Message]]:
        state = BootstrapState(
            manifest=self.manifest,
            feature_list=list(self.features),
            recent_progress=list(self.hist_progress),
            checkpoints=list(self.hist_checkpoints),
        )
        return state, list(self.hist_transcript)

    def wrote(self, n: int = 1) -> None:
        """`n` events were appended (the model's lists already changed)."""
        self.seq += n
        self.history[self.seq] = GONE if self.trimmed_stand_in else self.hist_state()
        for s in range(self.seq - n + 1, self.seq):
            self.history.setdefault(s, None)  # inside a batch: not checked

    def progress_added(self, entry: ProgressEntry) -> None:
        self.progress.append(entry)
        self.hist_progress.append(entry)

    def checkpoint_added(self, cp: RunCheckpoint) -> None:
        self.checkpoints.append(cp)
        self.hist_checkpoints.append(cp)

    def messages_added(self, msgs: list[Message]) -> None:
        self.transcript.extend(msgs)
        self.hist_transcript.extend(msgs)


GONE = "gone"


def _tombstoned(old: Ref) -> Ref:
    """What a session deleted with a tombstone reads as: one more seq, nothing else;
    history before the tombstone erased, except what an engine that cannot prune keeps
    of earlier archives (not modelled)."""
    t = old.seq + 1
    return Ref(
        seq=t,
        deleted=True,
        dropped=set(range(1, t + 1)),
        history=dict.fromkeys(range(1, t + 1)),
        compacted_at=t,
    )


sids = st.sampled_from(SIDS)
which = st.sampled_from(["main", "other"])
retentions = st.none() | st.builds(
    Retention,
    progress=st.none() | st.integers(0, 3),
    checkpoints=st.none() | st.integers(0, 3),
    messages=st.none() | st.integers(0, 3),
)


def _keep(items: list[Any], n: int | None) -> list[Any]:
    return items if n is None else (items[max(0, len(items) - n) :] if n else [])


class SessionStoreMachine(RuleBasedStateMachine):
    """The model; `CASE` (the engine) is set on the subclass made for each engine."""

    CASE: EngineCase

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="es-model-")
        self.url = self.CASE.fresh(Path(self.tmp))
        self.stores = {"main": self._open("main"), "other": self._open("other")}
        self.ref = {sid: Ref() for sid in SIDS}

    def _open(self, w: str) -> SessionStore:
        return SessionStore(self.url)

    def teardown(self) -> None:
        for s in self.stores.values():
            s.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the ten operations --------------------------------------------------------------

    @rule(sid=sids, w=which)
    def is_initialized(self, sid: str, w: str) -> None:
        assert self.stores[w].is_initialized(sid) == (self.ref[sid].manifest is not None)

    @rule(
        sid=sids,
        w=which,
        manifest=manifests(),
        features=feature_lists,
        entry=st.none() | progress_entries,
        checkpoint=st.none() | checkpoints,
    )
    def initialize_session_if_missing(
        self,
        sid: str,
        w: str,
        manifest: SessionManifest,
        features: list[FeatureRecord],
        entry: ProgressEntry | None,
        checkpoint: RunCheckpoint | None,
    ) -> None:
        manifest = msgspec.structs.replace(manifest, session_id=sid)  # it names its session
        ref = self.ref[sid]
        store = self.stores[w]
        if self._refused(sid, lambda: store.initialize_session_if_missing(sid, manifest, [])):
            return
        fresh = ref.manifest is None
        got = self.stores[w].initialize_session_if_missing(
            sid, manifest, features, entry, checkpoint
        )
        assert got is fresh
        if fresh:
            ref.manifest = manifest
            ref.features = list(features)
            n = 2
            if entry is not None:
                ref.progress_added(entry)
                n += 1
            if checkpoint is not None:
                ref.checkpoint_added(checkpoint)
                n += 1
            ref.wrote(n)

    @rule(sid=sids, w=which)
    def load_bootstrap_state(self, sid: str, w: str) -> None:
        assert self.stores[w].load_bootstrap_state(sid) == self.ref[sid].state()

    @rule(sid=sids, w=which, manifest=manifests())
    def save_manifest(self, sid: str, w: str, manifest: SessionManifest) -> None:
        manifest = msgspec.structs.replace(manifest, session_id=sid)  # it names its session
        if self._refused(sid, lambda: self.stores[w].save_manifest(sid, manifest)):
            return
        self.stores[w].save_manifest(sid, manifest)
        self.ref[sid].manifest = manifest
        self.ref[sid].wrote()

    @rule(sid=sids, w=which, entry=progress_entries)
    def append_progress_entry(self, sid: str, w: str, entry: ProgressEntry) -> None:
        if self._refused(sid, lambda: self.stores[w].append_progress_entry(sid, entry)):
            return
        self.stores[w].append_progress_entry(sid, entry)
        self.ref[sid].progress_added(entry)
        self.ref[sid].wrote()

    @rule(sid=sids, w=which, features=feature_lists)
    def replace_feature_list(self, sid: str, w: str, features: list[FeatureRecord]) -> None:
        if self._refused(sid, lambda: self.stores[w].replace_feature_list(sid, features)):
            return
        self.stores[w].replace_feature_list(sid, features)
        self.ref[sid].features = list(features)
        self.ref[sid].wrote()

    @rule(sid=sids, w=which, data=st.data(), passes=st.booleans())
    def update_feature_pass(self, sid: str, w: str, data: st.DataObject, passes: bool) -> None:
        ref = self.ref[sid]
        if self._refused(sid, lambda: self.stores[w].update_feature_pass(sid, "f", passes)):
            return
        ids = [f.id for f in ref.features]
        if ids and data.draw(st.booleans(), label="known id"):
            fid = data.draw(st.sampled_from(ids), label="feature id")
        else:
            fid = data.draw(texts, label="feature id")
        if fid in ids:
            self.stores[w].update_feature_pass(sid, fid, passes)
            ref.features = [
                msgspec.structs.replace(f, passes=passes) if f.id == fid else f
                for f in ref.features
            ]
            ref.wrote()
        else:
            with pytest.raises(FeatureNotFoundError):
                self.stores[w].update_feature_pass(sid, fid, passes)

    @rule(sid=sids, w=which, checkpoint=checkpoints)
    def record_run_checkpoint(self, sid: str, w: str, checkpoint: RunCheckpoint) -> None:
        if self._refused(sid, lambda: self.stores[w].record_run_checkpoint(sid, checkpoint)):
            return
        self.stores[w].record_run_checkpoint(sid, checkpoint)
        self.ref[sid].checkpoint_added(checkpoint)  # appended, never upserted by run_id
        self.ref[sid].wrote()

    @rule(sid=sids, w=which)
    def load_transcript_messages(self, sid: str, w: str) -> None:
        assert self.stores[w].load_transcript_messages(sid) == self.ref[sid].transcript

    @rule(sid=sids, w=which, msgs=st.lists(messages, max_size=4))
    def append_transcript_messages(self, sid: str, w: str, msgs: list[Message]) -> None:
        if self._refused(sid, lambda: self.stores[w].append_transcript_messages(sid, msgs)):
            return
        self.stores[w].append_transcript_messages(sid, msgs)
        self.ref[sid].messages_added(msgs)
        self.ref[sid].wrote()

    # -- the lower-level API -----------------------------------------------------------

    @rule(
        sid=sids,
        w=which,
        entries=st.lists(progress_entries, min_size=1, max_size=3),
        expect=st.sampled_from(["none", "right", "wrong"]),
        key=st.none() | st.sampled_from(["k1", "k2", "k3"]),
    )
    def append(
        self, sid: str, w: str, entries: list[ProgressEntry], expect: str, key: str | None
    ) -> None:
        """`append` with an expected sequence number and an idempotency key: a seen key
        replays its first result for the same request (times inside records aside) and
        refuses another (IdempotencyConflictError), writing nothing either way; a wrong
        expected seq raises ConcurrencyError and writes nothing."""
        ref = self.ref[sid]
        expected = {"none": None, "right": ref.seq, "wrong": ref.seq + 1}[expect]
        events = [ProgressAppended(entry=e) for e in entries]
        store = self.stores[w]
        if self._refused(
            sid, lambda: store.append(sid, events, expected_seq=expected, idempotency_key=key)
        ):
            return
        request = [(e.run_id, e.summary) for e in entries]
        if key is not None and key in ref.keys:
            span, first_request = ref.keys[key]
            if request != first_request:
                # a batch compacted away without an archive cannot be compared: it replays
                gone = any(s in ref.dropped for s in range(span[0], span[1] + 1))
                try:
                    res = self.stores[w].append(
                        sid, events, expected_seq=expected, idempotency_key=key
                    )
                except IdempotencyConflictError as exc:
                    assert (exc.first_seq, exc.last_seq) == span
                    return
                assert gone, "a key reused for another request replayed"
            else:
                res = self.stores[w].append(sid, events, expected_seq=expected, idempotency_key=key)
            assert res.replayed and (res.first_seq, res.last_seq) == span
            return
        if expect == "wrong":
            with pytest.raises(ConcurrencyError) as info:
                self.stores[w].append(sid, events, expected_seq=expected, idempotency_key=key)
            assert info.value.actual == ref.seq
            return
        res = self.stores[w].append(sid, events, expected_seq=expected, idempotency_key=key)
        assert not res.replayed and (res.first_seq, res.last_seq) == (
            ref.seq + 1,
            ref.seq + len(events),
        )
        if key is not None:
            ref.keys[key] = ((res.first_seq, res.last_seq), request)
        for e in entries:
            ref.progress_added(e)
        ref.wrote(len(events))

    # -- compaction, history, removal --------------------------------------------------

    @rule(sid=sids, w=which, archive=st.booleans(), retention=retentions)
    def compact(self, sid: str, w: str, archive: bool, retention: Retention | None) -> None:
        """Compaction changes nothing a reader sees, except what retention trims from
        the current state; history stays exact where it is archived. A deleted session
        is never compacted (its tombstone is its whole log)."""
        report = self.stores[w].compact(sid, archive=archive, retention=retention, force=True)
        if self.ref[sid].deleted:
            assert not report.compacted
            return
        self._compacted(self.ref[sid], archive, retention)

    @rule(sid=sids, entry=progress_entries)
    def auto_compaction(self, sid: str, entry: ProgressEntry) -> None:
        """A store with AutoCompact(max_events=1) compacts (with its archive) after an
        append that leaves more than a lone line, unless the snapshot would not be
        smaller than the log (then it changes nothing): which one, the head says."""
        ref = self.ref[sid]
        with SessionStore(self.url, auto_compact=AutoCompact(max_events=1)) as auto:
            if self._refused(sid, lambda: auto.append_progress_entry(sid, entry)):
                return
            auto.append_progress_entry(sid, entry)
            head = auto.engine.head(sid)
        ref.progress_added(entry)
        ref.wrote()
        if ref.seq > 1 and head.base_seq == head.seq:
            self._compacted(ref, True, None)

    @staticmethod
    def _compacted(ref: Ref, archive: bool, retention: Retention | None) -> None:
        if not ref.seq or (ref.compacted_at == ref.seq and retention is None):
            return  # nothing to compact, or already a lone snapshot: skipped
        ref.compacted_at = ref.seq
        if retention is not None:
            kept = (
                _keep(ref.progress, retention.progress),
                _keep(ref.checkpoints, retention.checkpoints),
                _keep(ref.transcript, retention.messages),
            )
            ref.trimmed |= kept != (ref.progress, ref.checkpoints, ref.transcript)
            ref.progress, ref.checkpoints, ref.transcript = kept
        if archive:
            ref.archived_upto = ref.seq
        elif ref.archived_upto < ref.seq:
            # what the archive did not keep is gone; the snapshot stands in at its seq
            for s in ref.history:
                if s > ref.archived_upto:
                    ref.history[s] = GONE
            ref.dropped.update(range(ref.archived_upto + 1, ref.seq + 1))
            ref.hist_progress = list(ref.progress)
            ref.hist_checkpoints = list(ref.checkpoints)
            ref.hist_transcript = list(ref.transcript)
            ref.history[ref.seq] = ref.hist_state()
            if ref.trimmed:  # the snapshot standing in for them holds no exact state
                ref.trimmed_stand_in = True
                ref.history[ref.seq] = GONE

    @rule(sid=sids, w=which, data=st.data())
    def state_at(self, sid: str, w: str, data: st.DataObject) -> None:
        ref = self.ref[sid]
        seq = data.draw(st.integers(0, ref.seq + 1), label="seq")
        store = self.stores[w]
        if seq == 0:
            assert store.state_at(sid, seq=0) == BootstrapState()
            return
        want = ref.history.get(seq)
        if seq > ref.seq or want == GONE:
            with pytest.raises(HistoryUnavailableError):
                store.state_at(sid, seq=seq)
            return
        if not isinstance(want, tuple):
            return  # inside a batch: not modelled
        assert store.state_at(sid, seq=seq) == want[0]
        assert store.transcript_at(sid, seq=seq) == want[1]

    @rule(src=sids, dst=sids, w=which, data=st.data())
    def fork_session(self, src: str, dst: str, w: str, data: st.DataObject) -> None:
        """A fork starts dst from `state_at(src, seq)` (its head when None): dst reads as
        that state at that seq, its history before it gone (no archive holds it there), the
        idempotency keys of batches up to it carried; refusals write nothing."""
        ref, store = self.ref[src], self.stores[w]
        if src != dst and self.ref[dst].seq and data.draw(st.booleans(), label="free dst"):
            store.delete_session(dst, purge=True)  # (most exist: free one, to fork into it)
            self.ref[dst] = Ref()
        if ref.deleted and not self.ref[dst].seq:
            with pytest.raises(SessionDeletedError):
                store.fork_session(src, dst)
            return
        if self.ref[dst].seq:
            with pytest.raises(SessionExistsError):
                store.fork_session(src, dst)
            return
        if not ref.seq:
            with pytest.raises(UnknownSessionError):
                store.fork_session(src, dst)
            return
        at = data.draw(st.none() | st.integers(1, ref.seq), label="at_seq")
        n = ref.seq if at is None else at
        want = ref.history.get(n)
        if want == GONE:
            with pytest.raises(HistoryUnavailableError):
                store.fork_session(src, dst, at_seq=at)
            return
        if not isinstance(want, tuple):
            return  # inside a batch: not modelled
        assert store.fork_session(src, dst, at_seq=at).seq == n
        state, transcript = want
        new = self.ref[dst] = Ref(
            manifest=state.manifest,
            features=list(state.feature_list),
            progress=list(state.recent_progress),
            checkpoints=list(state.checkpoints),
            transcript=list(transcript),
            seq=n,
            keys={k: v for k, v in ref.keys.items() if v[0][1] <= n},
            dropped=set(range(1, n + 1)),
            history={s: GONE for s in range(1, n)} | {n: want},
            hist_progress=list(state.recent_progress),
            hist_checkpoints=list(state.checkpoints),
            hist_transcript=list(transcript),
            compacted_at=n,  # its log is a lone snapshot: compacting it is skipped
        )
        assert store.verify(dst).ok and new.seq == store.last_seq(dst)

    @rule(sid=sids, w=which, purge=st.booleans())
    def delete_session(self, sid: str, w: str, purge: bool) -> None:
        """A tombstone (one more seq; reads empty, writes refused, history erased), or
        with `purge` no trace at all."""
        old = self.ref[sid]
        existed = self.stores[w].delete_session(sid, purge=purge)
        if purge:
            assert existed == (old.seq > 0)
            self.ref[sid] = Ref()
        elif old.deleted or not old.seq:
            assert existed is False
        else:
            assert existed is True
            self.ref[sid] = _tombstoned(old)

    @rule(
        w=which,
        idle=st.none() | st.just(timedelta(hours=1)),
        later=st.booleans(),
        keep_events=st.none() | st.integers(1, 4),
        dry_run=st.booleans(),
    )
    def gc(
        self,
        w: str,
        idle: timedelta | None,
        later: bool,
        keep_events: int | None,
        dry_run: bool,
    ) -> None:
        """`gc` with a `Policy`: as of two hours `later` every live session with events is
        idle (every event was written just now), so with `idle` each is tombstoned as
        `delete_session` would; any other whose live log holds more than `keep_events`
        lines is compacted with its archive (unless the snapshot would not be smaller: the
        report says which). A dry run changes nothing; nothing fails."""
        live = sorted(sid for sid in SIDS if self.ref[sid].seq and not self.ref[sid].deleted)
        policy = Policy(idle=idle, keep_events=keep_events)
        now = datetime.now(UTC) + (timedelta(hours=2) if later else timedelta(0))
        report = self.stores[w].gc(policy, dry_run=dry_run, now=now)
        assert report.failed == [] and report.kept == []
        assert report.sessions == len(live)
        expired = live if idle is not None and later else []
        assert sorted(report.tombstoned) == expired
        for sid in report.compacted:
            ref = self.ref[sid]
            assert sid in live and sid not in expired
            lines = ref.seq - max(ref.compacted_at, 1) + 1  # (a snapshot is a line too)
            assert keep_events is not None and lines > keep_events
        if dry_run:
            return
        for sid in expired:
            self.ref[sid] = _tombstoned(self.ref[sid])
        for sid in report.compacted:
            self._compacted(self.ref[sid], True, None)

    @rule(sid=sids, w=which)
    def restore(self, sid: str, w: str) -> None:
        """Only a deleted session is restored, and then its id starts a fresh session."""
        restored = self.stores[w].restore(sid)
        assert restored == self.ref[sid].deleted
        if restored:
            self.ref[sid] = Ref()

    def _refused(self, sid: str, write: Callable[[], object]) -> bool:
        """Whether the session is deleted, and then that `write` raises
        SessionDeletedError and writes nothing."""
        if not self.ref[sid].deleted:
            return False
        with pytest.raises(SessionDeletedError):
            write()
        return True

    # -- around the operations ---------------------------------------------------------

    @rule(w=which)
    def reopen(self, w: str) -> None:
        """A new SessionStore on the same store (a restarted process); the old one closes."""
        old = self.stores[w]
        old.close()
        with pytest.raises(StoreClosedError):
            old.load_bootstrap_state(SIDS[0])
        self.stores[w] = self._open(w)

    @rule(sid=sids, w=which)
    def mutate_what_was_loaded(self, sid: str, w: str) -> None:
        """Callers may change what they loaded; the store's state is not affected."""
        state = self.stores[w].load_bootstrap_state(sid)
        for feature in state.feature_list:  # inside each record too, not only the list
            feature.steps.append("junk")
            feature.passes = not feature.passes
        state.feature_list.clear()
        state.recent_progress.append(ProgressEntry(run_id="x", summary="junk"))
        state.checkpoints = []
        if state.manifest is not None:
            state.manifest.metadata["junk"] = "x"
            state.manifest.current_objective = "junk"
        self.stores[w].load_transcript_messages(sid).append(Message(role="user", content="j"))  # type: ignore[arg-type]

    @precondition(lambda self: any(r.features for r in self.ref.values()))
    @rule(data=st.data(), w=which)
    def mutate_what_was_written(self, data: st.DataObject, w: str) -> None:
        """Changing a record after writing it does not change what was written."""
        sid = data.draw(st.sampled_from([s for s in SIDS if self.ref[s].features]))
        features = msgspec.convert(msgspec.to_builtins(self.ref[sid].features), list[FeatureRecord])
        self.stores[w].replace_feature_list(sid, features)
        self.ref[sid].wrote()  # the same list again: only the sequence moves
        features[0].passes = not features[0].passes
        features[0].steps.append("mutated")
        features.pop()

    @invariant()
    def both_stores_match_the_model(self) -> None:
        for sid in SIDS:
            ref = self.ref[sid]
            for s in self.stores.values():
                assert s.load_bootstrap_state(sid) == ref.state()
                assert s.load_transcript_messages(sid) == ref.transcript
                assert s.is_initialized(sid) == (ref.manifest is not None)
                assert s.last_seq(sid) == ref.seq
        listed = self.stores["main"].list_sessions()
        assert set(listed) == {
            sid for sid in SIDS if self.ref[sid].seq and not self.ref[sid].deleted
        }
        deleted = [t.session_id for t in self.stores["other"].deleted_sessions()]
        assert set(deleted) == {sid for sid in SIDS if self.ref[sid].deleted}


SETTINGS = settings(
    max_examples=int(os.environ.get("EVENTSTORE_MODEL_EXAMPLES", "30")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

for _case in ENGINES:
    _machine: Any = type(
        f"SessionStoreMachine_{_case.name}", (SessionStoreMachine,), {"CASE": _case}
    )
    _machine.TestCase.settings = SETTINGS
    globals()[f"TestSessionStoreModel_{_case.name}"] = _machine.TestCase
