"""A stateful model test: random sequences of the ten session operations, on two store
instances sharing a root (reopened at random points), against a tiny reference model of
the contract. State, transcript and sequence are compared after every step."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from strategies import checkpoints, feature_lists, manifests, messages, progress_entries, texts

from eventstore import (
    BootstrapState,
    FeatureNotFoundError,
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    SessionManifest,
    SessionStore,
    StoreClosedError,
)

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

    def state(self) -> BootstrapState:
        return BootstrapState(
            manifest=self.manifest,
            feature_list=list(self.features),
            recent_progress=list(self.progress),
            checkpoints=list(self.checkpoints),
        )


sids = st.sampled_from(SIDS)
which = st.sampled_from(["main", "other"])


class SessionStoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="es-model-")
        self.root = Path(self.tmp) / "store"
        self.stores = {"main": SessionStore(self.root), "other": SessionStore(self.root)}
        self.ref = {sid: Ref() for sid in SIDS}

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
        ref = self.ref[sid]
        fresh = ref.manifest is None
        got = self.stores[w].initialize_session_if_missing(
            sid, manifest, features, entry, checkpoint
        )
        assert got is fresh
        if fresh:
            ref.manifest = manifest
            ref.features = list(features)
            ref.seq += 2
            if entry is not None:
                ref.progress.append(entry)
                ref.seq += 1
            if checkpoint is not None:
                ref.checkpoints.append(checkpoint)
                ref.seq += 1

    @rule(sid=sids, w=which)
    def load_bootstrap_state(self, sid: str, w: str) -> None:
        assert self.stores[w].load_bootstrap_state(sid) == self.ref[sid].state()

    @rule(sid=sids, w=which, manifest=manifests())
    def save_manifest(self, sid: str, w: str, manifest: SessionManifest) -> None:
        self.stores[w].save_manifest(sid, manifest)
        self.ref[sid].manifest = manifest
        self.ref[sid].seq += 1

    @rule(sid=sids, w=which, entry=progress_entries)
    def append_progress_entry(self, sid: str, w: str, entry: ProgressEntry) -> None:
        self.stores[w].append_progress_entry(sid, entry)
        self.ref[sid].progress.append(entry)
        self.ref[sid].seq += 1

    @rule(sid=sids, w=which, features=feature_lists)
    def replace_feature_list(self, sid: str, w: str, features: list[FeatureRecord]) -> None:
        self.stores[w].replace_feature_list(sid, features)
        self.ref[sid].features = list(features)
        self.ref[sid].seq += 1

    @rule(sid=sids, w=which, data=st.data(), passes=st.booleans())
    def update_feature_pass(self, sid: str, w: str, data: st.DataObject, passes: bool) -> None:
        ref = self.ref[sid]
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
            ref.seq += 1
        else:
            with pytest.raises(FeatureNotFoundError):
                self.stores[w].update_feature_pass(sid, fid, passes)

    @rule(sid=sids, w=which, checkpoint=checkpoints)
    def record_run_checkpoint(self, sid: str, w: str, checkpoint: RunCheckpoint) -> None:
        self.stores[w].record_run_checkpoint(sid, checkpoint)
        self.ref[sid].checkpoints.append(checkpoint)  # appended, never upserted by run_id
        self.ref[sid].seq += 1

    @rule(sid=sids, w=which)
    def load_transcript_messages(self, sid: str, w: str) -> None:
        assert self.stores[w].load_transcript_messages(sid) == self.ref[sid].transcript

    @rule(sid=sids, w=which, msgs=st.lists(messages, max_size=4))
    def append_transcript_messages(self, sid: str, w: str, msgs: list[Message]) -> None:
        self.stores[w].append_transcript_messages(sid, msgs)
        self.ref[sid].transcript.extend(msgs)
        self.ref[sid].seq += 1

    # -- around the operations ---------------------------------------------------------

    @rule(w=which)
    def reopen(self, w: str) -> None:
        """A new SessionStore on the same root (a restarted process); the old one closes."""
        old = self.stores[w]
        old.close()
        with pytest.raises(StoreClosedError):
            old.load_bootstrap_state(SIDS[0])
        self.stores[w] = SessionStore(self.root)

    @rule(sid=sids, w=which)
    def mutate_what_was_loaded(self, sid: str, w: str) -> None:
        """Callers may change what they loaded; the store's state is not affected."""
        state = self.stores[w].load_bootstrap_state(sid)
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
        self.ref[sid].seq += 1
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
        assert set(listed) >= {sid for sid in SIDS if self.ref[sid].seq}


SessionStoreMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSessionStoreModel = SessionStoreMachine.TestCase
