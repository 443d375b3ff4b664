"""Compaction (issue 4): every projection gives the same answer before and after, the
sequence continues, retention is opt-in, a crash at any step leaves exactly the old or
the new log, and compaction is safe beside live writers and readers in other processes."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import (
    FlipCounted,
    log_path,
    make_checkpoint,
    make_entry,
    make_features,
    make_manifest,
    wait_child,
)
from conftest import FlipsPerRun as ReadmeFlips
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import checkpoints, feature_lists, manifests, messages, progress_entries

from eventstore import (
    AutoCompact,
    Event,
    FeaturePassUpdated,
    InvalidArgumentError,
    Message,
    ProgressAppended,
    ProgressEntry,
    Retention,
    Role,
    RunCheckpoint,
    SessionStore,
    Snapshot,
    SnapshotVersionError,
)
from eventstore.engines.file.layout import (
    TMP_MARK,
    SessionPaths,
)
from eventstore.format.chain import (
    line_hash,
    split_hash,
)
from projections import StructProjection

# a multiprocessing child a failed test left behind is killed after it
pytestmark = pytest.mark.usefixtures("no_leftover_children")

SID = "s1"
SETTINGS = settings(
    deadline=None,
    max_examples=35,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
PROJECTIONS = ("bootstrap", "transcript", "idempotency", "flips")
TMP_PREFIX = "log.jsonl.compact-"


# -- a custom event and a user projection: feature flips counted per run -------------------


class FlipsPerRun(ReadmeFlips):
    """Counts flips per run: custom `flip_counted` events and built-in pass updates (`*`)."""

    event_types = frozenset({"flip_counted", "feature_pass_updated"})

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        if type(event) is FeaturePassUpdated:
            state["*"] = state.get("*", 0) + 1
            return state
        return super().apply(state, event)


class FlipsPerRunV2(StructProjection[list[tuple[str, int]]]):
    """The same projection with another state shape (a sorted list), hence version 2."""

    name = "flips"
    version = 2
    event_types = frozenset({"flip_counted", "feature_pass_updated"})
    state_type = list[tuple[str, int]]

    def initial(self) -> list[tuple[str, int]]:
        return []

    def apply(self, state: list[tuple[str, int]], event: Event) -> list[tuple[str, int]]:
        run = (
            event.run_id
            if type(event) is FlipCounted
            else "*"
            if type(event) is FeaturePassUpdated
            else None
        )
        if run is None:
            return state
        counts = dict(state)
        counts[run] = counts.get(run, 0) + 1
        return sorted(counts.items())


def open_store(root: Path, **kw: Any) -> SessionStore:
    """A store that knows the custom event and the user projection."""
    return SessionStore(root, event_types=[FlipCounted], projections=[FlipsPerRun()], **kw)


def all_states(store: SessionStore, sid: str = SID) -> dict[str, Any]:
    return {name: store.load(sid, name) for name in PROJECTIONS}


def paths_of(root: Path, sid: str = SID) -> SessionPaths:
    return SessionPaths(root, sid)


def tmp_files(root: Path, sid: str = SID) -> list[str]:
    """Temporary files in the session directory and its archive (an old release's
    compaction temporary, or any atomic write's `.tmp-`)."""
    p = paths_of(root, sid)
    names = [n for n in os.listdir(p.dir) if n.startswith(TMP_PREFIX) or TMP_MARK in n]
    if p.archive.is_dir():
        names += [f"archive/{n}" for n in os.listdir(p.archive) if TMP_MARK in n]
    return sorted(names)


def archive_links_to_live_log(root: Path, sid: str = SID) -> list[Path]:
    """Archive files that are the live log itself (same inode): a stray link."""
    p = paths_of(root, sid)
    live = os.stat(p.log)
    if not p.archive.exists():
        return []
    return [
        p.archive / n
        for n in os.listdir(p.archive)
        if (os.stat(p.archive / n).st_ino, os.stat(p.archive / n).st_dev)
        == (live.st_ino, live.st_dev)
    ]


def log_lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def build_history(store: SessionStore, sid: str = SID, n: int = 6) -> None:
    """A small realistic session: init batch, progress, messages, flips, a keyed append."""
    store.initialize_session_if_missing(
        sid, make_manifest(sid), make_features(3), make_entry(0), make_checkpoint()
    )
    for i in range(1, n + 1):
        store.append_progress_entry(sid, make_entry(i))
        store.append_transcript_messages(sid, [Message(role=Role.USER, content=f"m{i}")])
        store.update_feature_pass(sid, f"f{i % 3 + 1}", bool(i % 2))
        store.append(sid, [FlipCounted(run_id=f"r{i % 2}", feature_id="f1")])
        store.record_run_checkpoint(sid, make_checkpoint(f"run-{i}"))
    store.append(sid, [ProgressAppended(entry=make_entry(99))], idempotency_key="k-1")


# -- hypothesis: random histories, random compaction points ---------------------------------

runs = st.sampled_from(["r1", "r2", "r3"])
ops = st.one_of(
    st.tuples(st.just("init"), manifests(st.just(SID)), feature_lists),
    st.tuples(st.just("progress"), progress_entries),
    st.tuples(st.just("checkpoint"), checkpoints),
    st.tuples(st.just("messages"), st.lists(messages, min_size=1, max_size=3)),
    st.tuples(st.just("features"), feature_lists),
    st.tuples(st.just("pass"), st.integers(0, 9), st.booleans()),
    st.tuples(st.just("manifest"), manifests(st.just(SID))),
    st.tuples(st.just("flip"), runs, st.integers(1, 3)),
    st.tuples(st.just("keyed"), st.integers(0, 3)),
    st.tuples(st.just("compact"), st.booleans()),
    st.tuples(st.just("compact"), st.booleans()),
)


T0 = datetime(2026, 1, 1, tzinfo=UTC)  # one request, one time: the store and its twin agree


def apply_op(store: SessionStore, twin: SessionStore, op: tuple[Any, ...]) -> None:
    """Apply one history step to `store` and to its never-compacted twin."""
    kind = op[0]
    for s in (store, twin):
        if kind == "init":
            s.initialize_session_if_missing(SID, op[1], op[2])
        elif kind == "progress":
            s.append_progress_entry(SID, op[1])
        elif kind == "checkpoint":
            s.record_run_checkpoint(SID, op[1])
        elif kind == "messages":
            s.append_transcript_messages(SID, op[1])
        elif kind == "features":
            s.replace_feature_list(SID, op[1])
        elif kind == "pass":
            feats = twin.load_bootstrap_state(SID).feature_list
            if feats:
                s.update_feature_pass(SID, feats[op[1] % len(feats)].id, op[2])
        elif kind == "manifest":
            s.save_manifest(SID, op[1])
        elif kind == "flip":
            s.append(SID, [FlipCounted(run_id=op[1], feature_id="f") for _ in range(op[2])])
        elif kind == "keyed":  # a retried append (the same request): the second time replays
            entry = ProgressEntry(run_id="keyed", summary=f"keyed request {op[1]}", created_at=T0)
            s.append(SID, [ProgressAppended(entry=entry)], idempotency_key=f"key-{op[1]}")


@SETTINGS
@given(history=st.lists(ops, min_size=1, max_size=25))
def test_random_histories_fold_identically_across_compactions(
    history: list[tuple[Any, ...]],
) -> None:
    """Random histories (built-in ops and custom events) with random, repeated compactions,
    with and without archive: every projection (bootstrap, transcript, idempotency keys,
    the user projection) equals a never-compacted twin's, in the compacting instance, a
    fresh instance and an instance that cached state before the compaction; later
    appends continue the sequence without a gap."""
    with tempfile.TemporaryDirectory() as tmp:
        root, twin_root = Path(tmp) / "a", Path(tmp) / "twin"
        with open_store(root) as a, open_store(twin_root) as twin, open_store(root) as cached:
            compactions = 0
            for op in history:
                if op[0] == "compact":
                    expected = all_states(twin)
                    assert all_states(cached) == expected  # cache state before the swap
                    before = a.last_seq(SID)
                    # forced: a log this small might not shrink (that skip is tested
                    # in test_prune_compaction.py); here the snapshot is what is tested
                    report = a.compact(SID, archive=op[1], force=True)
                    compactions += report.compacted
                    assert a.last_seq(SID) == before
                    assert all_states(a) == expected
                    assert all_states(cached) == expected
                    with open_store(root) as fresh:
                        assert all_states(fresh) == expected
                        assert fresh.last_seq(SID) == before
                    if before:
                        lines = log_lines(paths_of(root).log)
                        assert len(lines) == 1 and b'"type":"snapshot"' in lines[0]
                else:
                    apply_op(a, twin, op)
                    assert a.last_seq(SID) == twin.last_seq(SID)
            expected = all_states(twin)
            assert all_states(a) == expected
            assert all_states(cached) == expected
            last = a.last_seq(SID)
            res = a.append(SID, [FlipCounted(run_id="end", feature_id="f")])
            assert (res.first_seq, res.last_seq) == (last + 1, last + 1)
            twin.append(SID, [FlipCounted(run_id="end", feature_id="f")])
            with open_store(root) as fresh:
                assert all_states(fresh) == all_states(twin)
                res = fresh.append(SID, [ProgressAppended(entry=make_entry(1))])
                assert res.first_seq == last + 2
            assert cached.load(SID, "flips") == twin.load(SID, "flips")


def test_compaction_writes_one_snapshot_and_keeps_the_old_log_in_the_archive(
    root: Path,
) -> None:
    """A compaction replaces the log by one snapshot line at the last sequence number,
    linked to the hash of that line, and archives the old log verbatim under
    `archive/<first>-<last>.jsonl`."""
    with open_store(root) as s:
        build_history(s)
        p = paths_of(root)
        old = p.log.read_bytes()
        last = s.last_seq(SID)
        report = s.compact(SID)
        assert report.compacted and report.first_seq == 1 and report.last_seq == last
        assert report.events_before == len(old.splitlines()) and report.events_after == 1
        assert report.bytes_before == len(old)
        assert report.archive_path == p.archive / f"{1:012d}-{last:012d}.jsonl"
        assert report.archive_path.read_bytes() == old
        snap = msgspec.json.decode(log_lines(p.log)[0], type=Snapshot)
        old_last = msgspec.json.decode(old.splitlines()[-1], type=dict[str, Any])
        assert snap.seq == last and snap.base_h == old_last["h"]
        assert set(snap.states) >= set(PROJECTIONS)
        # compacting a lone snapshot again is a no-op
        again = s.compact(SID)
        assert not again.compacted and again.archive_path is None
        assert p.log.read_bytes() == log_lines(p.log)[0] + b"\n"


# -- retention -------------------------------------------------------------------------------


def test_default_compaction_drops_nothing(root: Path) -> None:
    """Without a Retention, every progress entry, checkpoint and message survives."""
    with open_store(root) as s:
        build_history(s, n=30)
        before = all_states(s)
        s.compact(SID, archive=False)
        s.compact(SID)
    with open_store(root) as s:
        after = s.load_bootstrap_state(SID)
        assert len(after.recent_progress) == 32 and len(after.checkpoints) == 31
        assert len(s.load_transcript_messages(SID)) == 30
        assert all_states(s) == before


def test_retention_keeps_the_newest_and_the_archive_keeps_the_rest(root: Path) -> None:
    """Retention(progress=N, checkpoints=M, messages=K) keeps the newest N/M/K in the
    snapshot (order kept); everything dropped is still in the archive file."""
    with open_store(root) as s:
        build_history(s, n=10)
        full = all_states(s)
        report = s.compact(SID, retention=Retention(progress=3, checkpoints=2, messages=4))
        kept = s.load_bootstrap_state(SID)
        assert kept.recent_progress == full["bootstrap"].recent_progress[-3:]
        assert kept.checkpoints == full["bootstrap"].checkpoints[-2:]
        assert kept.feature_list == full["bootstrap"].feature_list
        assert kept.manifest == full["bootstrap"].manifest
        assert s.load_transcript_messages(SID) == full["transcript"][-4:]
        assert s.load(SID, "flips") == full["flips"]
        with open_store(root) as fresh:
            assert fresh.load_bootstrap_state(SID) == kept
        assert report.archive_path is not None
        archived = report.archive_path.read_text()
        for e in full["bootstrap"].recent_progress:
            assert msgspec.json.encode(e.summary).decode() in archived
        for m in full["transcript"]:
            assert msgspec.json.encode(m.content).decode() in archived
        # retention 0 drops every item of that list, and only that list
        s.compact(SID, retention=Retention(messages=0))
        assert s.load_transcript_messages(SID) == []
        assert s.load_bootstrap_state(SID).recent_progress == kept.recent_progress


@pytest.mark.parametrize(
    "kw",
    [
        {"progress": -1},
        {"checkpoints": -5},
        {"messages": 1.5},
        {"progress": "3"},
        {"messages": True},
    ],
)
def test_invalid_retention_is_a_typed_error(kw: dict[str, Any]) -> None:
    """Negative, non-integer and boolean retention counts are refused, with an
    `InvalidArgumentError` (a `ValueError` too): a plain `ValueError` was no
    `EventStoreError`."""
    with pytest.raises(InvalidArgumentError, match="Retention"):
        Retention(**kw)


# -- a user projection that changes version -----------------------------------------------


def _flip_history(s: SessionStore) -> None:
    build_history(s, n=4)


def test_projection_version_change_rebuilds_from_archive(root: Path) -> None:
    """A projection whose version changed after a compaction (archive=True) is rebuilt
    from the archive, also after repeated compactions and later appends."""
    with open_store(root) as s:
        _flip_history(s)
        s.compact(SID)
        s.append(SID, [FlipCounted(run_id="r9", feature_id="f2")])
        s.compact(SID)
        s.append(SID, [FlipCounted(run_id="r9", feature_id="f2")])
        v1 = s.load(SID, "flips")
    expected = sorted(v1.items())
    with SessionStore(root, event_types=[FlipCounted], projections=[FlipsPerRunV2()]) as s2:
        assert s2.load(SID, "flips") == expected
        s2.compact(SID)  # writes version 2 state
        s2.append(SID, [FlipCounted(run_id="r9", feature_id="f3")])
    with SessionStore(root, event_types=[FlipCounted], projections=[FlipsPerRunV2()]) as s3:
        assert s3.load(SID, "flips") == sorted({**v1, "r9": v1["r9"] + 1}.items())


def test_projection_version_change_without_archive_raises_clearly(root: Path) -> None:
    """With archive=False the history is gone: loading a projection whose version changed
    raises SnapshotVersionError naming the projection, both versions' context and the
    remedy, rather than misreading the old state."""
    with open_store(root) as s:
        _flip_history(s)
        s.compact(SID, archive=False)
        boot = s.load_bootstrap_state(SID)
    with SessionStore(root, event_types=[FlipCounted], projections=[FlipsPerRunV2()]) as s2:
        with pytest.raises(SnapshotVersionError) as info:
            s2.load(SID, "flips")
        msg = str(info.value)
        assert "'flips'" in msg and "version 2" in msg and "archive" in msg
        assert s2.load_bootstrap_state(SID) == boot  # other projections still load


# -- crash at every step of the protocol ---------------------------------------------------

FS_CALLS = ("open", "write", "fsync", "close", "link", "replace", "rename", "mkdir", "unlink")


class Injector:
    """Wraps the os calls compaction makes; counts them and fails the k-th one."""

    def __init__(self, fail_at: int | None = None, action: Callable[[], None] | None = None):
        self.fail_at = fail_at
        self.action = action
        self.calls: list[str] = []

    def install(self, mp: pytest.MonkeyPatch) -> None:
        for name in FS_CALLS:
            mp.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kw: Any) -> Any:
            self.calls.append(name)
            if len(self.calls) == self.fail_at:
                assert self.action is not None
                self.action()
            return real(*args, **kw)

        return wrapper


def _setup(root: Path, repeat: bool) -> SessionStore:
    s = open_store(root)
    build_history(s, n=3)
    if repeat:  # the log already starts with a snapshot and the archive dir exists
        s.compact(SID)
        s.append_progress_entry(SID, make_entry(50))
        s.append(SID, [FlipCounted(run_id="r5", feature_id="f1")])
    return s


def _count_calls(tmp: Path, repeat: bool) -> list[str]:
    root = tmp / "count"
    with _setup(root, repeat) as s, pytest.MonkeyPatch.context() as mp:
        inj = Injector()
        inj.install(mp)
        s.compact(SID)
    return inj.calls


def _check_after_crash(root: Path, s: SessionStore, expected: dict[str, Any], last: int) -> None:
    """The session opens with exactly its state; appends continue; a second compaction
    succeeds and leaves no stray temporary file and no archive link to the live log."""
    assert all_states(s) == expected
    with open_store(root) as fresh:
        assert all_states(fresh) == expected
        assert fresh.last_seq(SID) == last
        res = fresh.append(SID, [FlipCounted(run_id="after", feature_id="f1")])
        assert res.first_seq == last + 1
    report = s.compact(SID)
    assert report.compacted and report.last_seq == last + 1
    assert tmp_files(root) == []
    assert archive_links_to_live_log(root) == []
    with open_store(root) as fresh:
        exp = dict(expected, flips={**expected["flips"], "after": 1})
        assert all_states(fresh) == exp
        assert all_states(s) == exp
    # nothing in the archive grows with the live log any more
    p = paths_of(root)
    sizes = {n: (p.archive / n).stat().st_size for n in os.listdir(p.archive)}
    s.append_progress_entry(SID, make_entry(77))
    assert {n: (p.archive / n).stat().st_size for n in os.listdir(p.archive)} == sizes


@pytest.mark.parametrize("repeat", [False, True], ids=["first", "repeat"])
def test_failure_at_every_filesystem_call(tmp_path: Path, repeat: bool) -> None:
    """Make the k-th filesystem call of a compaction raise OSError, for every k: the
    compaction raises or completes, the session opens with exactly the state it had (in
    the same and a fresh instance), no temporary file or archive link to the live log is
    left, and a second compaction succeeds."""
    calls = _count_calls(tmp_path, repeat)
    assert {"write", "fsync", "replace"} <= set(calls), calls
    # the first compaction links the old log into the archive; a repeat one archives a
    # copy of the events after the old snapshot instead (issue 12 item 13)
    assert ("link" in calls) != repeat, calls

    def boom() -> None:
        raise OSError(5, "injected I/O error")

    for k in range(1, len(calls) + 1):
        root = tmp_path / f"k{k}"
        with _setup(root, repeat) as s:
            expected, last = all_states(s), s.last_seq(SID)
            inj = Injector(k, boom)
            with pytest.MonkeyPatch.context() as mp:
                inj.install(mp)
                try:
                    s.compact(SID)
                except OSError:
                    pass
            assert len(inj.calls) >= k, f"call {k} ({calls[k - 1]}) was not reached"
            assert tmp_files(root) == [], f"stray temp file after failing call {k}"
            assert archive_links_to_live_log(root) == [], f"stray link after call {k}"
            _check_after_crash(root, s, expected, last)


@pytest.mark.slow
@pytest.mark.parametrize("repeat", [False, True], ids=["first", "repeat"])
def test_hard_crash_at_every_filesystem_call(tmp_path: Path, repeat: bool) -> None:
    """A process killed at the k-th filesystem call of a compaction (os._exit: no cleanup
    runs) leaves the session with exactly the state it had, as seen by an instance that
    cached state before and by a fresh one; writes continue; the next compaction removes
    the stray temporary file and archive link and succeeds."""
    calls = _count_calls(tmp_path, repeat)
    crashed_with_strays = 0
    for k in range(1, len(calls) + 1):
        root = tmp_path / f"k{k}"
        with _setup(root, repeat) as s:
            expected, last = all_states(s), s.last_seq(SID)
            pid = os.fork()
            if pid == 0:  # the child: compact, die at call k
                try:
                    with open_store(root) as child, pytest.MonkeyPatch.context() as mp:
                        Injector(k, lambda: os._exit(70)).install(mp)
                        child.compact(SID)
                    os._exit(0)
                finally:
                    os._exit(1)
            assert wait_child(pid, 60) == 70, f"call {k} did not crash"
            crashed_with_strays += bool(tmp_files(root) or archive_links_to_live_log(root))
            _check_after_crash(root, s, expected, last)
    assert crashed_with_strays > 0  # the test did exercise the stray cleanup


# -- writers, readers and a compactor in separate processes --------------------------------


def _writer(root: str, name: str, out: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    with open_store(Path(root)) as s, open(out, "w") as f:
        i = 0
        while time.monotonic() < deadline:
            summary = f"{name}-{i}"
            if i % 3 == 2:
                res = s.append(SID, [FlipCounted(run_id=name, feature_id=summary)])
            else:
                entry = ProgressEntry(run_id=name, summary=summary)
                res = s.append(SID, [ProgressAppended(entry=entry)])
            f.write(f"{res.first_seq} {summary}\n")
            f.flush()
            i += 1
    os._exit(0)


def _compactor(root: str, stop: Any, out: str) -> None:
    n = 0
    with open_store(Path(root)) as s:
        while not stop.is_set():
            n += s.compact(SID).compacted
            stop.wait(0.05)  # pacing only: correctness never depends on timing
    Path(out).write_text(str(n))
    os._exit(0)


def _reader(root: str, stop: Any, out: str) -> None:
    """Loads repeatedly; records any state that is not a prefix of writer w0's appends."""
    problems: list[str] = []
    loads = 0
    with open_store(Path(root)) as s:
        prev_n, prev_seq = 0, 0
        while not stop.is_set():
            seq = s.last_seq(SID)
            summaries = [e.summary for e in s.load_bootstrap_state(SID).recent_progress]
            n = len(summaries)
            if summaries != [f"w0-{i}" for i in range(n)]:
                problems.append(f"not a prefix: {summaries[-5:]}")
            if n < prev_n or seq < prev_seq:
                problems.append(f"went back: {n} < {prev_n} or {seq} < {prev_seq}")
            prev_n, prev_seq = n, seq
            loads += 1
    Path(out).write_text(f"{loads}\n" + "\n".join(problems))
    os._exit(0)


def read_chain(root: Path, sid: str = SID) -> list[tuple[Path, list[bytes]]]:
    """The archive files (oldest first) and the live log, each as its lines."""
    p = paths_of(root, sid)
    files = sorted(p.archive.glob("*.jsonl")) if p.archive.exists() else []
    return [(f, log_lines(f)) for f in [*files, p.log]]


def verify_chain(root: Path, sid: str = SID) -> list[dict[str, Any]]:
    """Check archive + live log as `verify` would: no gap, no repeat, every hash link,
    each snapshot linked to the hash of the line it replaces. Returns every non-snapshot
    event (as a dict) in sequence order."""
    events: list[dict[str, Any]] = []
    h_of: dict[int, str] = {}
    link, expected_seq = "", 1
    for path, lines in read_chain(root, sid):
        for i, line in enumerate(lines):
            split = split_hash(line)
            assert split is not None, f"{path}:{i}: no hash"
            body, h = split
            d = msgspec.json.decode(line, type=dict[str, Any])
            if d["type"] == "snapshot":
                assert i == 0, f"{path}: snapshot after the first line"
                assert d["seq"] == expected_seq - 1, f"{path}: snapshot at {d['seq']}"
                assert d["base_h"] == h_of[d["seq"]], f"{path}: snapshot not linked"
                link = d["base_h"]
                assert h == line_hash(link, body), f"{path}: snapshot hash"
                continue
            if i == 0 and expected_seq > 1 and d["seq"] != expected_seq:
                # an archive after the first holds the events after an archived snapshot:
                # it must continue the chain exactly (issue 12 item 13)
                raise AssertionError(f"{path}: starts without a snapshot at {d['seq']}")
            assert d["seq"] == expected_seq, f"{path}:{i}: seq {d['seq']} != {expected_seq}"
            assert h == line_hash(link, body), f"{path}:{i}: broken hash link"
            h_of[d["seq"]] = h
            link, expected_seq = h, expected_seq + 1
            events.append(d)
    return events


@pytest.mark.slow
def test_two_writers_and_a_compactor_in_separate_processes(root: Path) -> None:
    """Two processes append continuously (recording every acknowledged seq) while a
    third compacts repeatedly: every acknowledged event is present exactly once at its
    acknowledged seq, the sequence has no gap across archive and live log, the hash links
    verify, and the folded state holds each event once."""
    with open_store(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    outs = [root.parent / f"w{i}.txt" for i in range(2)]
    nout = root.parent / "compactions.txt"
    writers = [
        ctx.Process(target=_writer, args=(str(root), f"w{i}", str(outs[i]), 3.0)) for i in range(2)
    ]
    comp = ctx.Process(target=_compactor, args=(str(root), stop, str(nout)))
    for p in (*writers, comp):
        p.start()
    for p in writers:
        p.join(30)
        assert p.exitcode == 0
    stop.set()
    comp.join(30)
    assert comp.exitcode == 0
    compactions = int(nout.read_text())
    assert compactions >= 3, compactions

    acked: dict[int, str] = {}
    for out in outs:
        for line in out.read_text().splitlines():
            seq, summary = line.split()
            assert int(seq) not in acked, f"seq {seq} acknowledged twice"
            acked[int(seq)] = summary
    assert len(acked) > 50

    events = verify_chain(root)
    by_seq = {e["seq"]: e for e in events}
    assert len(by_seq) == len(events)
    for seq, summary in acked.items():
        e = by_seq[seq]
        got = e["entry"]["summary"] if e["type"] == "progress_appended" else e["feature_id"]
        assert got == summary
    written = [
        e["entry"]["summary"] if e["type"] == "progress_appended" else e["feature_id"]
        for e in events
        if e["type"] in ("progress_appended", "flip_counted")
    ]
    assert sorted(written) == sorted(acked.values())  # exactly once, nothing unacknowledged
    with open_store(root) as fresh:
        progress = [e.summary for e in fresh.load_bootstrap_state(SID).recent_progress]
        kinds = {v: by_seq[k]["type"] for k, v in acked.items()}
        assert sorted(progress) == sorted(v for v, t in kinds.items() if t == "progress_appended")
        flips = fresh.load(SID, "flips")
        for w in ("w0", "w1"):
            n = sum(1 for v, t in kinds.items() if t == "flip_counted" and v.startswith(w + "-"))
            assert flips.get(w, 0) == n
        assert fresh.last_seq(SID) == max(by_seq)


def test_reader_in_another_process_notices_compaction(root: Path) -> None:
    """A reader process loading continuously while this process appends in order and
    compacts: every state it sees is a prefix of the appends (nothing counted twice,
    nothing missed, never going back), and `last_seq` only grows."""
    with open_store(root) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        out = root.parent / "reader.txt"
        reader = ctx.Process(target=_reader, args=(str(root), stop, str(out)))
        reader.start()
        try:
            for i in range(300):
                s.append_progress_entry(SID, ProgressEntry(run_id="w0", summary=f"w0-{i}"))
                if i % 25 == 24:  # without archive, freed inodes may be reused
                    s.compact(SID, archive=i % 50 == 24)
                if i % 60 == 0:
                    time.sleep(0.02)  # give the reader a chance to interleave
        finally:
            stop.set()
            reader.join(30)
        assert reader.exitcode == 0
        loads, *problems = out.read_text().split("\n")
        assert int(loads) > 0
        assert [p for p in problems if p] == []
        with open_store(root) as fresh:
            got = [e.summary for e in fresh.load_bootstrap_state(SID).recent_progress]
            assert got == [f"w0-{i}" for i in range(300)]


def test_cached_instance_notices_compaction_and_continues(root: Path) -> None:
    """An instance that folded the log before another instance compacted it and appended
    more sees exactly the new state (no event counted twice or missed) and continues
    the sequence with its own appends."""
    with open_store(root) as a, open_store(root) as b:
        build_history(a, n=3)
        before = all_states(b)
        a.compact(SID)
        a.append(SID, [FlipCounted(run_id="r0", feature_id="f1")])
        a.append_transcript_messages(SID, [Message(role=Role.TOOL, content="x")])
        got = all_states(b)
        assert got["flips"]["r0"] == before["flips"]["r0"] + 1
        assert got["transcript"] == [*before["transcript"], Message(role=Role.TOOL, content="x")]
        assert got == all_states(a)
        last = a.last_seq(SID)
        assert b.last_seq(SID) == last
        assert b.append(SID, [FlipCounted(run_id="r0", feature_id="f1")]).first_seq == last + 1
        assert a.load(SID, "flips")["r0"] == before["flips"]["r0"] + 2


def test_reader_survives_inode_reuse_after_compaction_without_archive(root: Path) -> None:
    """An instance that cached its fold, then two compactions with archive=False by
    another instance: the file system may give the new log the inode of the one the
    cache was folded from. The cached instance must still see exactly the new state
    (skipped where the file system does not reuse the inode)."""
    with open_store(root) as a, open_store(root) as b:
        for i in range(40):
            a.append_progress_entry(SID, make_entry(i))
        assert len(b.load_bootstrap_state(SID).recent_progress) == 40
        cached_ino = paths_of(root).log.stat().st_ino
        for j in range(30):
            a.compact(SID, archive=False)
            a.append_progress_entry(SID, make_entry(100 + j))
            if paths_of(root).log.stat().st_ino == cached_ino:
                break
        else:
            pytest.skip("this file system did not reuse the inode")
        assert b.load_bootstrap_state(SID) == a.load_bootstrap_state(SID)
        assert len(b.load_bootstrap_state(SID).recent_progress) == 41 + j


# -- automatic compaction --------------------------------------------------------------------


def _line_count(root: Path) -> int:
    return len(log_lines(paths_of(root).log))


def test_auto_compaction_by_event_count(root: Path, tmp_path: Path) -> None:
    """AutoCompact(max_events=8) compacts once the log holds 8 lines: at rest it never
    holds more than 7, the archive fills, and the state equals an uncompacted twin's.
    (Fewer of these small entries would not shrink the log: that compaction is skipped,
    tests/test_prune_compaction.py.)"""
    with (
        open_store(root, auto_compact=AutoCompact(max_events=8)) as s,
        open_store(tmp_path / "twin") as twin,
    ):
        for i in range(23):
            for st_ in (s, twin):
                st_.append_progress_entry(SID, make_entry(i))
            assert _line_count(root) <= 7
        assert len(list(paths_of(root).archive.glob("*.jsonl"))) >= 3
        assert all_states(s) == all_states(twin)
        assert s.last_seq(SID) == 23
        with open_store(root) as fresh:
            assert all_states(fresh) == all_states(twin)


def test_auto_compaction_by_size(root: Path) -> None:
    """AutoCompact(max_bytes=N) compacts after the append that takes the log past N."""
    with open_store(root, auto_compact=AutoCompact(max_bytes=2000, archive=False)) as s:
        for _ in range(40):
            s.append_transcript_messages(SID, [Message(role=Role.USER, content="x" * 100)])
            assert paths_of(root).log.stat().st_size < 2000 + 5000  # snapshot grows with state
        lines = log_lines(paths_of(root).log)
        assert b'"type":"snapshot"' in lines[0]
        assert not paths_of(root).archive.exists()
        assert len(s.load_transcript_messages(SID)) == 40


def test_no_automatic_compaction_by_default(root: Path) -> None:
    """Without auto_compact, a log is never compacted, however long."""
    with open_store(root) as s:
        for i in range(300):
            s.append_progress_entry(SID, make_entry(i))
        assert _line_count(root) == 300
        assert not paths_of(root).archive.exists()
        assert b"snapshot" not in paths_of(root).log.read_bytes()


def test_failed_auto_compaction_does_not_fail_the_committed_append(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append is committed before the automatic compaction runs; if that compaction
    fails, append must still report success (and the event is there once, uncompacted).
    Otherwise the caller would retry and duplicate the event."""
    # 8 lines: enough that the snapshot is smaller, so the compaction does run (and fail)
    with open_store(root, auto_compact=AutoCompact(max_events=8)) as s:
        for i in range(7):
            s.append_progress_entry(SID, make_entry(i))
        replaced: list[object] = []

        def fail(*a: Any, **k: Any) -> None:
            replaced.append(a)
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "replace", fail)
        try:
            res = s.append(SID, [ProgressAppended(entry=make_entry(7))])
        finally:
            monkeypatch.undo()
        assert replaced  # the compaction ran and failed
        assert res.first_seq == 8 and not res.replayed
        assert len(s.load_bootstrap_state(SID).recent_progress) == 8
        assert _line_count(root) == 8 and tmp_files(root) == []


@pytest.mark.usefixtures("no_transcript_cache")  # the log read itself is attacked
def test_bootstrap_load_after_compaction_never_decodes_the_transcript(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold bootstrap load after compaction reads the snapshot line once (its hash
    covers the whole line, and loads check every hash) but decodes only the bootstrap
    state: the (large) transcript state is never turned into messages. The transcript
    load decodes it, and both equal their state before compaction."""
    from projections import TranscriptProjection

    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.initialize_session_if_missing("s", make_manifest("s"), make_features(5))
        for i in range(200):
            store.append_transcript_messages(
                "s", [Message(role=Role.ASSISTANT, content=f"{i}" + "x" * 5000)]
            )
            store.append_progress_entry("s", make_entry(i))
        before = (store.load_bootstrap_state("s"), store.load_transcript_messages("s"))
        store.compact("s")
    size = SessionPaths(root, "s").log.stat().st_size
    assert size > 1_000_000  # the transcript dominates the snapshot

    decoded: list[int] = []
    real_decode = TranscriptProjection.decode_state

    def spy_decode(self: TranscriptProjection, data: bytes) -> list[Message]:
        decoded.append(len(data))
        return real_decode(self, data)

    monkeypatch.setattr(TranscriptProjection, "decode_state", spy_decode)
    with SessionStore(root) as store:
        assert store.load_bootstrap_state("s") == before[0]
        assert decoded == []
        assert store.load_transcript_messages("s") == before[1]
        assert len(decoded) == 1 and decoded[0] > 1_000_000


# -- attacks -------------------------------------------------------------------------------


_SID = "s"


def test_appends_beside_another_stores_compactions_fold_what_a_cold_load_reads(
    root: Path,
) -> None:
    """One store appends on the hot path (messages, progress, checkpoints) while another
    instance (its own engine, as another process would be) compacts in a loop; the
    writer's folded states equal a cold load's after, every append is there once."""
    with SessionStore(root) as s:
        s.initialize_session_if_missing(_SID, make_manifest(_SID), make_features(2))
    stop = threading.Event()
    compactions = [0]

    def compactor() -> None:
        with SessionStore(root) as other:
            while not stop.is_set():
                if other.compact(_SID, force=True).compacted:
                    compactions[0] += 1

    t = threading.Thread(target=compactor)
    with SessionStore(root) as s:
        s.load_transcript_messages(_SID)
        s.load_bootstrap_state(_SID)
        t.start()
        try:
            for i in range(200):
                if i == 100:  # a busy machine may starve the compactor: give it its turn
                    deadline = time.monotonic() + 30
                    while compactions[0] == 0 and time.monotonic() < deadline:
                        time.sleep(0.001)
                s.append_transcript_messages(_SID, [Message(Role.USER, f"m{i}")])
                if i % 3 == 0:
                    s.append_progress_entry(_SID, make_entry(i))
                if i % 7 == 0:
                    s.record_run_checkpoint(_SID, RunCheckpoint(f"run{i}"))
        finally:
            stop.set()
            t.join()
        warm = (s.load_transcript_messages(_SID), s.load_bootstrap_state(_SID))
    with SessionStore(root) as cold:
        assert (cold.load_transcript_messages(_SID), cold.load_bootstrap_state(_SID)) == warm
        assert cold.verify(_SID).ok
    assert [m.content for m in warm[0]] == [f"m{i}" for i in range(200)]
    assert len(warm[1].recent_progress) == 67 and len(warm[1].checkpoints) == 29
    assert compactions[0] > 0


# -- attacks -------------------------------------------------------------------------------


class AllFlips(ReadmeFlips):
    """The README's flips-per-run projection, but reading every event type
    (`event_types=None`, which the Projection protocol allows: "None: all")."""

    name = "all_flips"
    event_types = None


def _side_files(root: Path, sid: str = _SID) -> list[Path]:
    return sorted(log_path(root, sid).parent.glob("fold-*.cache"))


@pytest.mark.usefixtures("collector_on")
def test_compaction_by_an_unaware_process_keeps_an_all_types_projection_state(
    tmp_path: Path,
) -> None:
    """01c7587 leaves out of a snapshot the state of a projection that reads an event
    type the compactor skipped, but only when `event_types` is a set: a projection with
    `event_types=None` reads every type, the skipped ones included, yet its state (folded
    without them) is stored, and a reader that decodes them trusts it. README,
    Compaction: every projection gives the same answer before and after."""
    root = tmp_path / "store"
    with SessionStore(root, event_types=[FlipCounted], projections=[AllFlips()]) as s:
        for i in range(40):
            s.append(_SID, [FlipCounted(run_id="r1")])
            s.append_progress_entry(_SID, make_entry(i))
        before = s.load(_SID, "all_flips")
    assert before == {"r1": 40}
    with SessionStore(root, projections=[AllFlips()]) as unaware:  # knows no flip_counted
        report = unaware.compact(_SID, force=True)
        assert report.compacted and report.unknown_kept == 40
    for p in _side_files(root):
        p.unlink()
    with SessionStore(root, event_types=[FlipCounted], projections=[AllFlips()]) as s:
        assert s.load(_SID, "all_flips") == before  # fails: {} (the unaware fold)
