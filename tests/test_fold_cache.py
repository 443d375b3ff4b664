"""The persistent fold cache (issue 14, item 2): a cold load starts from the cached
state and folds only the tail; a cache that does not check is ignored and rebuilt.

Attacks on the cache file: flipped bytes anywhere, truncation at any length, a cache
swapped in from another session, a stale one after compaction, repair or removal, a
symlink or a FIFO planted in its place, one from a newer projection version or of
another projection. In each case the load must equal the truth (the fold of the log
with no cache at all), and the next close must leave a cache that checks.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import oracle
import pytest
from conftest import (
    FlipCounted,
    LoadSpy,
    cache_path,
    check_whole,
    log_path,
    make_checkpoint,
    make_entry,
    make_features,
    make_manifest,
)
from conftest import FlipsPerRun as ReadmeFlips
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuning import tune

from eventstore import (
    BootstrapState,
    CorruptLogError,
    Message,
    Retention,
    Role,
    SessionStore,
)
from eventstore.core import checked_prefix, fold_cache
from eventstore.core.session_core import core_of
from eventstore.core.tuning import Tuning
from eventstore.engines.base import CachingEngine
from eventstore.format.events import Event
from projections import BootstrapProjection, StructProjection


def _cache(root: Path, sid: str, name: str = "bootstrap") -> Path:
    return cache_path(root, sid, name)


def _fill(store: SessionStore, sid: str, turns: int = 120) -> None:
    store.initialize_session_if_missing(sid, make_manifest(sid), make_features(20))
    for i in range(turns):
        store.append_transcript_messages(sid, [Message(role=Role.USER, content="x" * 600)])
        store.append_progress_entry(sid, make_entry(i))
        if i % 10 == 0:
            store.update_feature_pass(sid, f"f{i % 20 + 1}", i % 20 == 0)
            store.record_run_checkpoint(sid, make_checkpoint(f"run-{i}"))


@pytest.fixture
def filled(root: Path) -> BootstrapState:
    with SessionStore(root) as s:
        _fill(s, "s")
        state = s.load_bootstrap_state("s")
    assert _cache(root, "s").is_file()
    return state


def test_close_writes_a_private_cache_and_a_cold_load_folds_nothing(
    root: Path, filled: BootstrapState, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert stat.S_IMODE(os.lstat(_cache(root, "s")).st_mode) == 0o600
    with SessionStore(root) as s:
        spy = LoadSpy(s, monkeypatch)
        assert s.load_bootstrap_state("s") == filled
        assert spy.decoders == 0 and spy.folded == 0  # no tail: no decoder, no fold
    assert filled == oracle.truth(root, "s").state


def test_a_cold_load_folds_only_the_tail(
    root: Path, filled: BootstrapState, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(root) as w:
        w.core.caches.cached = {}  # this writer leaves the cache as it was
        w.append_progress_entry("s", make_entry(999))
        w.append_transcript_messages("s", [Message(role=Role.ASSISTANT, content="tail")])
        tail = len(w.engine.read("s", None).data) - _logged_at_cache(root)
    with SessionStore(root) as s:
        spy = LoadSpy(s, monkeypatch)
        state = s.load_bootstrap_state("s")
        assert spy.folded == tail > 0
    assert state == oracle.truth(root, "s").state
    assert state.recent_progress[-1].summary == "step 999"


def _logged_at_cache(root: Path) -> int:
    header = _cache(root, "s").read_bytes().split(b"\n", 1)[0]
    return int(msgspec.json.decode(header)["offset"])


def test_a_load_only_if_kept_never_folds_a_log_from_its_start(
    root: Path, filled: BootstrapState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`loaded_if_kept` loads from a fold cache (or a state kept) and folds the lines
    after it; without either it folds nothing and keeps nothing, unless the log is
    empty (a new session: nothing to fold)."""
    bootstrap = BootstrapProjection()
    with SessionStore(root) as s:
        s.append_progress_entry("s", make_entry(999))  # a line past the cache
        spy = LoadSpy(s, monkeypatch)
        got = core_of(s).loaded_if_kept("s", s.bootstrap, bootstrap.copy)
        assert got == s.load_bootstrap_state("s") and 0 < spy.folded < 1000
    _cache(root, "s").unlink()
    with SessionStore(root) as s:
        spy = LoadSpy(s, monkeypatch)
        assert core_of(s).loaded_if_kept("s", s.bootstrap, bootstrap.copy) is None
        assert spy.folded == 0 and "bootstrap" not in s.cache_info("s").folds
        assert core_of(s).loaded_if_kept("new", s.bootstrap, bootstrap.copy) == bootstrap.initial()
        assert "bootstrap" in s.cache_info("new").folds  # kept: its appends advance it


def test_a_tampered_tail_after_the_cached_position_is_still_caught(
    root: Path, filled: BootstrapState
) -> None:
    with SessionStore(root) as w:
        w.append_progress_entry("s", make_entry(999))
    log = log_path(root, "s")
    data = log.read_bytes()
    log.write_bytes(data.replace(b"step 999", b"step 998"))
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_bootstrap_state("s")


def _assert_ignored_and_rebuilt(root: Path, truth: BootstrapState) -> None:
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s") == truth
        assert s.cache_info("s").folds["bootstrap"][1] is None  # not from the cache
    with SessionStore(root) as s:  # the close above rebuilt it
        assert s.load_bootstrap_state("s") == truth
        assert s.cache_info("s").folds["bootstrap"][1] == s.last_seq("s")  # type: ignore[union-attr]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_flipped_byte_anywhere_is_ignored(
    root: Path, filled: BootstrapState, data: st.DataObject
) -> None:
    cache = _cache(root, "s")
    good = cache.read_bytes()
    i = data.draw(st.integers(0, len(good) - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    bad = bytearray(good)
    bad[i] ^= 1 << bit
    cache.write_bytes(bytes(bad))
    _assert_ignored_and_rebuilt(root, filled)


@pytest.mark.parametrize("base_seq", [0, 3, 9])
def test_a_cache_naming_another_first_seq_is_ignored(
    root: Path, filled: BootstrapState, base_seq: int
) -> None:
    """The head a cache hands the face carries the live log's first seq: a cache whose
    line says another one (found flipping bits of `"base_seq":1`) is no cache of this log."""
    cache = _cache(root, "s")
    good = cache.read_bytes()
    assert b'"base_seq":1}' in good.split(b"\n", 1)[0]
    cache.write_bytes(good.replace(b'"base_seq":1}', b'"base_seq":%d}' % base_seq, 1))
    _assert_ignored_and_rebuilt(root, filled)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_truncated_cache_is_ignored(
    root: Path, filled: BootstrapState, data: st.DataObject
) -> None:
    cache = _cache(root, "s")
    good = cache.read_bytes()
    cache.write_bytes(good[: data.draw(st.integers(0, len(good) - 1), label="length")])
    _assert_ignored_and_rebuilt(root, filled)


def test_a_cache_swapped_in_from_another_session_is_ignored(
    root: Path, filled: BootstrapState
) -> None:
    with SessionStore(root) as s:
        _fill(s, "t", turns=125)
    shutil.copyfile(_cache(root, "t"), _cache(root, "s"))
    _assert_ignored_and_rebuilt(root, filled)


@pytest.mark.parametrize("replacer", ["compact", "repair", "remove"])
def test_a_stale_cache_after_a_replacement_is_ignored(
    root: Path, filled: BootstrapState, replacer: str
) -> None:
    stale = _cache(root, "s").read_bytes()
    with SessionStore(root) as s:
        if replacer == "compact":
            s.compact("s")
        elif replacer == "repair":
            from eventstore.ops.repair import repair

            with open(log_path(root, "s"), "ab") as f:
                f.write(b'{"torn')
            repair(s, "s")
        else:
            assert s.delete_session("s", purge=True) is True
            assert not _cache(root, "s").parent.exists()  # removed with the session
            _fill(s, "s")
    truth = oracle.truth(root, "s").state
    _cache(root, "s").write_bytes(stale)
    _assert_ignored_and_rebuilt(root, truth)


def test_compaction_writes_a_cache_of_the_snapshot(root: Path, filled: BootstrapState) -> None:
    with SessionStore(root) as s:
        s.compact("s")
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s") == filled
        assert s.cache_info("s").folds["bootstrap"][1] == s.last_seq("s")  # type: ignore[union-attr]


def _copy_store(root: Path, how: str) -> Path:
    """The store at `root` copied with new inodes: `shutil.copytree` (or without the
    lock files), `cp -a`, or copied away and restored over itself (the backup copied
    back while the original still holds its inode numbers, then renamed over it)."""
    dest = root.parent / f"copy-{how}"
    if how == "copytree":
        shutil.copytree(root, dest)
    elif how == "no lock file":  # generation 0, as an empty one (never replaced)
        shutil.copytree(root, dest, ignore=shutil.ignore_patterns("log.lock"))
    elif how == "cp -a":
        subprocess.run(["cp", "-a", str(root), str(dest)], check=True)
    else:  # the backup copied back beside the store, then put in its place
        shutil.copytree(root, dest)
        back = shutil.copytree(dest, root.parent / "restoring")
        shutil.rmtree(root)
        back.rename(root)
        dest = root
    return dest


def _from_cache(root: Path, sid: str = "s") -> bool:
    """Whether a cold load of `sid` (a fresh store) started from its bootstrap cache."""
    with SessionStore(root) as s:
        s.load_bootstrap_state(sid)
        return s.cache_info(sid).folds["bootstrap"][1] is not None


@pytest.mark.parametrize("how", ["copytree", "cp -a", "restored", "no lock file"])
def test_a_copied_or_restored_store_loads_from_its_caches(
    root: Path, filled: BootstrapState, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caches are bound to the log's bytes and the lock file's generation, not to the
    log's inode: a copy of the store (every file a new inode) is the same log, and a
    cold load of it folds nothing."""
    before = os.stat(log_path(root, "s")).st_ino
    copy = _copy_store(root, how)
    assert os.stat(log_path(copy, "s")).st_ino != before
    with SessionStore(copy) as s:
        spy = LoadSpy(s, monkeypatch)
        assert s.load_bootstrap_state("s") == filled
        assert s.cache_info("s").folds["bootstrap"][1] == s.last_seq("s")
        assert spy.folded == 0
    assert filled == oracle.truth(copy, "s").state


def _replace(store: SessionStore, root: Path, replacer: str) -> None:
    """Replace (or end) the log of session "s" the way `replacer` names."""
    if replacer == "compact":
        assert store.compact("s", force=True).compacted
    elif replacer == "compact-retain":
        assert store.compact("s", force=True, retention=Retention(messages=3)).compacted
    elif replacer == "repair":
        from eventstore.ops.repair import repair

        with open(log_path(root, "s"), "ab") as f:
            f.write(b'{"torn')
        repair(store, "s")
    elif replacer == "tombstone":
        assert store.delete_session("s") is True
    else:
        assert store.delete_session("s", purge=True) is True
        _fill(store, "s")


@pytest.mark.parametrize(
    "replacer", ["compact", "compact-retain", "repair", "tombstone", "purge-recreate"]
)
@pytest.mark.parametrize("how", ["copytree", "cp -a"])
def test_a_copy_whose_log_is_then_replaced_never_serves_the_old_cache(
    root: Path, filled: BootstrapState, replacer: str, how: str
) -> None:
    """Attack: copy the store, replace the copy's log (a compaction, one with retention,
    a repair, a tombstone, a purge and the id written again), then plant the cache the
    copy started with back, as it is and with its generation rewritten to the live one:
    the load equals the truth. The cache as it was is never used (the replacement moved
    the generation); relabelled, only where the live log still holds every byte it was
    folded from (a repair that cut a torn tail after them), which is then no stale
    cache."""
    copy = _copy_store(root, how)
    stale = _cache(copy, "s").read_bytes()
    with SessionStore(copy) as s:
        _replace(s, copy, replacer)
    truth = oracle.truth(copy, "s").state
    lock = log_path(copy, "s").with_name("log.lock")
    gen = int.from_bytes(lock.read_bytes()[:8], "big")  # docs/log-format.md, "The lock file"
    engine, rest = stale.split(b"\n", 1)
    relabelled = msgspec.json.encode({**msgspec.json.decode(engine), "gen": gen}) + b"\n" + rest
    for plant in (stale, relabelled):
        _cache(copy, "s").write_bytes(plant)
        with SessionStore(copy) as s:
            assert s.load_bootstrap_state("s") == truth
            used = s.cache_info("s").folds["bootstrap"][1] is not None
        assert used == (plant is relabelled and replacer == "repair"), replacer


def test_a_cache_of_another_session_or_store_with_the_same_offsets_is_refused(
    root: Path, filled: BootstrapState
) -> None:
    """Attack: a cache written for a log of the same shape (every offset and seq the
    same, other bytes): the same id in another store, and another id of this store
    with its cache moved over: neither is used, and the load equals the truth."""
    other = root.parent / "other"
    with SessionStore(other) as s:
        _fill(s, "s")
    with SessionStore(root) as s:
        _fill(s, "t")
    mine = msgspec.json.decode(_cache(root, "s").read_bytes().split(b"\n", 1)[0])
    for source in (_cache(other, "s"), _cache(root, "t")):
        theirs = msgspec.json.decode(source.read_bytes().split(b"\n", 1)[0])
        assert {k: theirs[k] for k in ("offset", "seq", "gen")} == {
            k: mine[k] for k in ("offset", "seq", "gen")
        }
        shutil.copyfile(source, _cache(root, "s"))
        _assert_ignored_and_rebuilt(root, filled)


def _rewrite_snapshot(log: Path, edit: Callable[[bytes], bytes]) -> None:
    """Restore `log` by hand (no generation moved) with its opening snapshot edited by
    `edit` and re-hashed, so that the log checks."""
    snap, nl, tail = log.read_bytes().partition(b"\n")
    base_h = msgspec.json.decode(snap)["base_h"]
    tmp = log.with_name("restored")
    tmp.write_bytes(oracle.rehash(edit(snap), base_h) + nl + tail)
    os.replace(tmp, log)


def _older_release(snap: bytes) -> bytes:
    """The snapshot as releases before snapshots described themselves wrote it."""
    return re.sub(rb'"length":\d+,"layout":\{[^}]*\},', b"", snap, count=1)


def _other_summary(snap: bytes) -> bytes:
    """Another state of the same length: a progress summary in the states changed."""
    i = snap.index(b"step 1")
    return snap[:i] + b"step 7" + snap[i + 6 :]


@pytest.mark.parametrize("release", ["current", "older"])
def test_a_log_restored_with_another_opening_snapshot_of_the_same_shape_is_refused(
    root: Path, filled: BootstrapState, release: str
) -> None:
    """Attack: the lines after a snapshot chain to its `base_h`, not to its `h`: a log
    restored by hand (no generation moved) whose opening snapshot holds another state
    of the same length, re-hashed, agrees with the old log on every later `h` and
    offset. The cache of the old log is not used: it records the snapshot's `h` (also
    of a snapshot an older release wrote, without `length`, whose cache is used)."""
    with SessionStore(root) as s:
        assert s.compact("s", force=True).compacted
    if release == "older":
        _rewrite_snapshot(log_path(root, "s"), _older_release)
    with SessionStore(root) as s:
        for i in range(40):
            s.append_progress_entry("s", make_entry(500 + i))
        before = s.load_bootstrap_state("s")
    assert _from_cache(root)
    _rewrite_snapshot(log_path(root, "s"), _other_summary)
    truth = oracle.truth(root, "s").state
    assert truth != before  # the edit is in the state the log folds to
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s") == truth
        assert s.cache_info("s").folds["bootstrap"][1] is None


@pytest.mark.parametrize("plant", ["fifo", "directory"])
def test_a_lock_file_that_cannot_be_read_never_hangs_a_load_nor_vouches_for_a_cache(
    root: Path, filled: BootstrapState, plant: str
) -> None:
    """A FIFO or a directory where the lock file should be (a copy made by a careless
    tool): its generation is unknown, so no cache is used, and the load neither hangs
    nor fails: it folds the log."""
    copy = shutil.copytree(root, root.parent / "copy", ignore=shutil.ignore_patterns("log.lock"))
    lock = log_path(copy, "s").with_name("log.lock")
    os.mkfifo(lock) if plant == "fifo" else lock.mkdir()
    with SessionStore(copy) as s:
        assert s.load_bootstrap_state("s") == filled
        assert s.cache_info("s").folds["bootstrap"][1] is None


@pytest.mark.parametrize("line", ["inode-bound", "format 1", "format 3", "no gen"])
def test_a_cache_whose_engine_line_is_of_another_format_is_ignored(
    root: Path, filled: BootstrapState, line: str
) -> None:
    """A cache written before caches survived a copy (its engine line names the log's
    device and inode, and no format), or of a format to come, is ignored, never an
    error, and rebuilt; even naming the live log's inode."""
    cache = _cache(root, "s")
    engine, rest = cache.read_bytes().split(b"\n", 1)
    e = msgspec.json.decode(engine)
    st_ = os.stat(log_path(root, "s"))
    if line == "inode-bound":
        e = {"dev": st_.st_dev, "ino": st_.st_ino, **e}
        del e["format"], e["gen"], e["opening"]
    elif line == "no gen":
        del e["gen"]
    else:
        e["format"] = int(line[-1])
    cache.write_bytes(msgspec.json.encode(e) + b"\n" + rest)
    _assert_ignored_and_rebuilt(root, filled)


def test_a_symlink_planted_in_its_place_is_never_followed(
    root: Path, filled: BootstrapState, tmp_path: Path
) -> None:
    cache = _cache(root, "s")
    target = tmp_path / "elsewhere"
    target.write_bytes(cache.read_bytes())  # even a valid cache, through a link
    cache.unlink()
    cache.symlink_to(target)
    _assert_ignored_and_rebuilt(root, filled)
    assert not cache.is_symlink() and cache.is_file()  # replaced, not written through
    assert target.read_bytes().startswith(b"{")


def test_a_fifo_planted_in_its_place_does_not_hang_a_load(
    root: Path, filled: BootstrapState
) -> None:
    cache = _cache(root, "s")
    cache.unlink()
    os.mkfifo(cache)
    _assert_ignored_and_rebuilt(root, filled)


def _rewrite(root: Path, change: dict[str, Any]) -> None:
    """Change the face header of the cache and recompute its digest: only the check of
    what the header says can reject it."""
    cache = _cache(root, "s")
    engine_head, rest = cache.read_bytes().split(b"\n", 1)
    body = rest[: -fold_cache._CHECKSUM_HEX - 1]
    header, state = body.split(b"\n", 1)
    fields = msgspec.json.decode(header)
    fields.update(change)
    body = msgspec.json.encode(fields) + b"\n" + state
    cache.write_bytes(engine_head + b"\n" + body + fold_cache._checksum([body]))


@pytest.mark.parametrize(
    "change",
    [{"version": 2}, {"projection": "other"}, {"session": "t"}, {"format": 99}, {"seq": 1}],
)
def test_a_cache_that_says_it_is_something_else_is_ignored(
    root: Path, filled: BootstrapState, change: dict[str, Any]
) -> None:
    _rewrite(root, change)
    _assert_ignored_and_rebuilt(root, filled)


def test_the_rewrite_helper_itself_keeps_a_cache_valid(root: Path, filled: BootstrapState) -> None:
    """The control for the test above: with no change, the rewritten cache is used."""
    _rewrite(root, {})
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s") == filled
        assert s.cache_info("s").folds["bootstrap"][1] == s.last_seq("s")  # type: ignore[union-attr]


def test_a_state_that_does_not_decode_is_ignored(root: Path, filled: BootstrapState) -> None:
    cache = _cache(root, "s")
    engine_head, rest = cache.read_bytes().split(b"\n", 1)
    header = rest.split(b"\n", 1)[0]
    body = header + b"\n" + b'{"feature_list":"not a list"}' + b"\n"
    cache.write_bytes(engine_head + b"\n" + body + fold_cache._checksum([body]))
    _assert_ignored_and_rebuilt(root, filled)


def test_small_sessions_and_unknown_ones_get_no_cache(root: Path) -> None:
    with SessionStore(root) as s:
        s.append_progress_entry("small", make_entry(0))
        assert s.load_bootstrap_state("small").recent_progress
        assert s.load_bootstrap_state("unknown") == BootstrapState()
    assert not _cache(root, "small").exists()
    assert not _cache(root, "unknown").parent.exists()


def test_a_long_fold_writes_the_cache_without_waiting_for_close(root: Path) -> None:
    with SessionStore(root) as w:
        w.core.caches.cached = {}
        w.append_progress_entry("s", make_entry(0))
        for _ in range(1100):
            w.append_transcript_messages("s", [Message(role=Role.USER, content="y" * 1000)])
    s = SessionStore(root)
    s.load_bootstrap_state("s")
    assert _cache(root, "s").is_file()  # before close
    s.close()


_KILLED_WRITER = """
import os, sys
sys.path[:0] = {paths!r}
from conftest import make_entry, make_features, make_manifest
from eventstore import Message, Role, SessionStore
from eventstore.core.tuning import Tuning
s = SessionStore({root!r}, tuning=Tuning(cache_while_writing={every}))
s.initialize_session_if_missing("s", make_manifest("s"), make_features(20))
for i in range({turns}):
    s.append_transcript_messages("s", [Message(role=Role.USER, content="x" * 600)])
    if i % 50 == 0:
        s.append_progress_entry("s", make_entry(i))
os._exit(0)  # killed: never closed
"""


@pytest.mark.parametrize("every", [0, 8192])
def test_a_writer_keeps_its_caches_current_so_a_killed_one_leaves_a_short_fold(
    root: Path, every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Tuning.cache_while_writing`: a writer that is never closed (killed) has saved
    its states' fold caches as it went; the next process folds only the lines past the
    last save (at most `every` bytes, or eight times the cache's size), and still loads
    exactly the log's truth.
    With 0, only close saves them: the next process folds the whole log."""
    script = _KILLED_WRITER.format(
        paths=[str(Path(__file__).parent), *sys.path], root=str(root), every=every, turns=800
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    size = log_path(root, "s").stat().st_size
    with SessionStore(root) as s:
        spy = LoadSpy(s, monkeypatch)
        state = s.load_bootstrap_state("s")
        saved = s.cache_info("s").folds["bootstrap"][1]
    assert state == oracle.truth(root, "s").state
    if every:
        bound = max(every, 8 * _cache(root, "s").stat().st_size) + 2048  # + a turn
        assert saved is not None and 0 < spy.folded <= bound < size // 4
    else:
        assert saved is None and spy.folded == size


def test_a_writer_saves_its_cache_again_only_after_the_log_grew(root: Path) -> None:
    with SessionStore(root, tuning=Tuning(cache_while_writing=4096)) as w:
        w.initialize_session_if_missing("s", make_manifest("s"), make_features(20))
        saves: list[int] = []
        for i in range(600):
            w.append_progress_entry("s", make_entry(i))
            saves.append(w.cache_info("s").folds["bootstrap"][1] or 0)
        sizes = [s for s in sorted(set(saves)) if s]
        assert len(sizes) >= 2  # saved more than once while writing, never closed
        assert len(sizes) < 600 // 20  # but not at every append
        with SessionStore(root) as r:  # the writer still open: the reader starts there
            assert r.load_bootstrap_state("s") == w.load_bootstrap_state("s")
            assert r.cache_info("s").folds["bootstrap"][1] == saves[-1]


def test_a_writer_keeps_saving_after_another_store_compacted_its_log(root: Path) -> None:
    """A writer remembers what it found not yet due (the log size and seq of its next
    save) and skips the sums until then. Attack: another store compacts the log under
    it, to far less than the size at which the writer last saved; the writer must save
    again once the new log is long enough (as a writer that never saved would), not
    once it grows back past the old size."""
    every = 4096
    turn = [Message(role=Role.USER, content="x" * 2000)]
    with SessionStore(root, tuning=Tuning(cache_while_writing=every)) as w:
        w.initialize_session_if_missing("s", make_manifest("s"), make_features(3))
        for _ in range(150):
            w.append_transcript_messages("s", turn)
        while w.cache_info("s").folds["bootstrap"][1] == w.last_seq("s"):
            w.append_transcript_messages("s", turn)  # (a last append that found none due)
        before = log_path(root, "s").stat().st_size
        saved = w.cache_info("s").folds["bootstrap"][1]
        assert saved is not None and saved > 100  # saved as the log grew
        with SessionStore(root) as other:
            assert other.compact("s", force=True, retention=Retention(messages=2)).compacted
        seq = w.last_seq("s")
        while (w.cache_info("s").folds["bootstrap"][1] or 0) <= seq:
            w.append_transcript_messages("s", turn)
            assert log_path(root, "s").stat().st_size < before // 2
        with SessionStore(root) as r:
            assert r.load_bootstrap_state("s") == oracle.truth(root, "s").state


class _Counter(msgspec.Struct):
    n: int = 0


class _Counting(StructProjection[_Counter]):
    name = "counting"
    version = 1
    event_types = None
    state_type = _Counter
    cache_folds = True

    def initial(self) -> _Counter:
        return _Counter()

    def apply(self, state: _Counter, event: Event) -> _Counter:
        state.n += 1
        return state


class _Uncached(_Counting):
    name = "uncached"
    cache_folds = False


def test_a_projection_that_opts_in_is_cached_and_others_are_not(root: Path) -> None:
    with SessionStore(root, projections=[_Counting(), _Uncached()]) as s:
        _fill(s, "s")
        assert s.load("s", "counting").n == s.last_seq("s")
        assert s.load("s", "uncached").n == s.last_seq("s")
        s.load_transcript_messages("s")
    assert _cache(root, "s", "counting").is_file()
    assert _cache(root, "s", "transcript").is_file()  # the built-in transcript opts in
    assert not _cache(root, "s", "uncached").exists()
    with SessionStore(root, projections=[_Counting()]) as s:
        assert s.load("s", "counting").n == s.last_seq("s")
        assert s.cache_info("s").folds["counting"][1] == s.last_seq("s")  # type: ignore[union-attr]


class _OwnEncoding(_Counting):
    """Keeps its cache in MessagePack (`encode_cache`, `decode_cache`), its snapshots in
    JSON; counts the cache frames it decodes."""

    name = "own_encoding"
    decoded: ClassVar[list[bytes]] = []

    def encode_cache(self, state: _Counter) -> bytes:
        return msgspec.msgpack.encode(state)

    def decode_cache(self, data: bytes) -> _Counter:
        type(self).decoded.append(data)
        return msgspec.msgpack.decode(data, type=_Counter)


def test_a_projection_keeps_its_cache_in_its_own_encoding(root: Path) -> None:
    with SessionStore(root, projections=[_OwnEncoding()]) as s:
        _fill(s, "s")
        assert s.load("s", "own_encoding").n == s.last_seq("s")
        last = s.last_seq("s")
    _OwnEncoding.decoded.clear()
    with SessionStore(root, projections=[_OwnEncoding()]) as s:
        assert s.load("s", "own_encoding").n == last
        assert s.cache_info("s").folds["own_encoding"][1] == last  # read from its cache
    assert _OwnEncoding.decoded == [msgspec.msgpack.encode(_Counter(last))]
    assert msgspec.msgpack.encode(_Counter(last)) in _cache(root, "s", "own_encoding").read_bytes()


class _CountingEvery(_Counting):
    name = "counting_every"
    cache_every = 5


def test_a_projection_with_cache_every_is_saved_by_events_not_only_by_bytes(
    root: Path,
) -> None:
    """`cache_every = N`: a writer saves that projection's cache after N events, in a
    log far too short for the byte rule (which the other projection waits for)."""
    with SessionStore(root, projections=[_Counting(), _CountingEvery()]) as w:
        assert w.load("s", "counting").n == w.load("s", "counting_every").n == 0
        for i in range(23):
            w.append_progress_entry("s", make_entry(i))
            saved = w.cache_info("s").folds
            assert saved["counting"][1] is None  # 23 small lines: no byte rule yet
            every = saved["counting_every"][1] or 0
            assert w.last_seq("s") - every < 5
        with SessionStore(root, projections=[_CountingEvery()]) as r:  # w still open
            assert r.load("s", "counting_every").n == 23
            assert r.cache_info("s").folds["counting_every"][1] == 20


def test_the_memory_engine_keeps_no_cache_and_loads_the_same() -> None:
    with SessionStore("memory://fold-cache-test") as s:
        _fill(s, "s")
        before = s.load_bootstrap_state("s")
        assert not isinstance(s.engine, CachingEngine)
    with SessionStore("memory://fold-cache-test") as s:
        assert s.load_bootstrap_state("s") == before


def test_a_cache_that_fails_to_write_fails_nothing(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    with SessionStore(root) as s:
        _fill(s, "s")
        monkeypatch.setattr(s.engine, "store_cache", broken)
    assert "fold cache" in caplog.text
    with SessionStore(root) as s:
        assert s.load_bootstrap_state("s").manifest is not None


# -- loads read a long log piece by piece (Engine.read_some) ------------------------------


@pytest.mark.parametrize("piece", [1, 700, 5000])
def test_a_load_in_small_pieces_equals_one_in_one_piece(
    root: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    with SessionStore(root) as s:
        _fill(s, "s", turns=30)
        s.append_transcript_messages(  # one batch far longer than a piece
            "s", [Message(role=Role.TOOL, content="z" * 3000) for _ in range(5)]
        )
    truth, whole = oracle.truth(root, "s")
    tune(monkeypatch, read_piece=piece)
    calls: list[bool] = []
    with SessionStore(root) as s:
        s.core.caches.cached = {}
        real = s.engine.read_some

        def counting(sid: str, position: Any, limit: int) -> Any:
            res, more = real(sid, position, limit)
            assert len(res.data) <= max(limit, 16_000)  # a piece, or one long batch
            calls.append(more)
            return res, more

        monkeypatch.setattr(s.engine, "read_some", counting)
        assert s.load_bootstrap_state("s") == truth
        assert s.load_transcript_messages("s") == whole
        assert s.verify("s").ok
    assert calls.count(True) > 2 and calls[-1] is False


def test_a_log_replaced_between_two_pieces_is_folded_from_its_start(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(root) as s:
        _fill(s, "s", turns=30)
    truth = oracle.truth(root, "s").state
    tune(monkeypatch, read_piece=2000)
    with SessionStore(root) as s, SessionStore(root) as other:
        s.core.caches.cached = other.core.caches.cached = {}
        real = s.engine.read_some
        done: list[int] = []

        def compact_after_the_first_piece(sid: str, position: Any, limit: int) -> Any:
            got = real(sid, position, limit)
            if not done:
                done.append(1)
                other.compact(sid)  # the log is replaced under the load
            return got

        monkeypatch.setattr(s.engine, "read_some", compact_after_the_first_piece)
        assert s.load_bootstrap_state("s") == truth
        assert done


def test_an_engine_without_pieces_loads_in_one_read() -> None:
    with SessionStore("memory://pieces") as s:
        _fill(s, "s", turns=5)
        res, more = s.engine.read_some("s", None, 10)
        assert more is False and res.head.seq == s.last_seq("s")


# -- attacks on every side file a cold load trusts ---------------------------------------
#
# The fold caches, the checked prefix (`fold-x<digest>.cache`) and compaction's snapshot
# states, by an attacker with write access to the files (damage, stale copies, swaps,
# races, other processes of the same application) who does not recompute digests. Every
# load is compared with `oracle.truth`: a fold of an undamaged copy of the log by a store
# that reads and writes no cache and trusts no checked prefix.


SID = "s"


class FlipsPerRun(ReadmeFlips):
    """The README's custom projection, with its folds kept in the fold cache."""

    name = "flips_per_run"
    cache_folds = True


def _aware(root: Path, caches: bool = True) -> SessionStore:
    """The application as it is now: it knows `flip_counted`."""
    return SessionStore(root, event_types=[FlipCounted], projections=[FlipsPerRun()], caches=caches)


def _unaware(root: Path) -> SessionStore:
    """Another process on the same store that has the projection but not the event type
    (an older build, a tool, a worker started without the plug-in): the README says
    such a reader skips the type in folds and compaction keeps its lines verbatim."""
    return SessionStore(root, projections=[FlipsPerRun()])


def _fill_flips(root: Path, n: int = 150) -> None:
    with _aware(root) as s:  # > 64 KiB of log: caches are saved on close
        for i in range(n):
            s.append(SID, [FlipCounted(run_id=f"r{i % 3}")])
            s.append_transcript_messages(SID, [Message(Role.USER, "x" * 500)])


def _side_files(root: Path, sid: str = SID) -> list[Path]:
    d = log_path(root, sid).parent
    return sorted(p for p in d.iterdir() if p.name.startswith("fold-"))


def _fill_turns(store: SessionStore, sid: str = SID, turns: int = 80, start: int = 0) -> None:
    if not store.is_initialized(sid):
        store.initialize_session_if_missing(sid, make_manifest(sid), make_features(12))
    for i in range(start, start + turns):
        store.append_transcript_messages(sid, [Message(Role.USER, f"m{i} " + "w" * 900)])
        store.append_progress_entry(sid, make_entry(i))
        if i % 7 == 0:
            store.update_feature_pass(sid, f"f{i % 12 + 1}", i % 2 == 0)
            store.record_run_checkpoint(sid, make_checkpoint(f"run-{i}"))


def test_a_fold_cache_left_by_a_process_that_did_not_know_an_event_type_is_not_trusted(
    root: Path,
) -> None:
    """A process with the projection but without the event type folds the log (the
    README: such a reader skips the type) and closes: it saves its fold, which lacks
    every `flip_counted`, as a cache that checks (right session, projection, version and
    head). The application that knows the type then trusts that cache: its cold load
    answers {} where the log (and the same store with the cache deleted) says 150 flips.

    A cache must only save time; here it changes the answer, for every later process,
    until the log grows past it (and then it answers with a count missing 150 flips)."""
    _fill_flips(root)
    with _aware(root, caches=False) as s:
        truth = s.load(SID, "flips_per_run")
    assert truth == {"r0": 50, "r1": 50, "r2": 50}
    for p in _side_files(root):
        p.unlink()
    with _unaware(root) as other:
        assert other.load(SID, "flips_per_run") == {}  # skipped, as documented
    assert _cache(root, SID, "flips_per_run").is_file()  # ... and saved on close
    with _aware(root) as s:
        assert s.load(SID, "flips_per_run") == truth  # fails: {} from the cache


def test_a_snapshot_written_by_a_compactor_that_did_not_know_an_event_type(
    root: Path,
) -> None:
    """The same on compaction: the unaware process compacts (`unknown_kept=150`: the
    lines are kept verbatim, and `known` records that the compactor did not know
    `flip_counted`), but it stores its own fold of `flips_per_run` ({}) as the
    snapshot's state, and a reader that knows the type trusts it, with or without the
    fold cache. README, Compaction: "Every projection, built-in or yours, gives the
    same answer before and after" -- before: 150 flips; after: none."""
    _fill_flips(root)
    with _aware(root, caches=False) as s:
        before = s.load(SID, "flips_per_run")
    with _unaware(root) as other:
        report = other.compact(SID)
        assert report.compacted and report.unknown_kept == 150
    for p in _side_files(root):
        p.unlink()  # not the fold cache's doing: the snapshot itself
    with _aware(root) as s:
        assert s.load(SID, "flips_per_run") == before  # fails: {}


def test_a_huge_file_planted_as_a_cache_is_not_read_whole(root: Path) -> None:
    """A 256 MiB (sparse) file of zeros where the fold cache and the checked prefix
    live: `FileEngine.load_cache` reads the whole file into memory before it looks at
    its first line, for each of the two, on every cold load, and the close of a small
    session never replaces them. Measured: a 1 GiB pair turns a 1 ms cold load of a
    20-line session into ~4 s and 1 GiB of memory. A cache no longer than its header
    says it is is ignored after reading its first line (a few hundred bytes)."""
    with SessionStore(root) as s:
        for i in range(20):
            s.append_transcript_messages(SID, [Message(Role.USER, f"m{i}")])
        s.append_progress_entry(SID, make_entry(1))
    truth = oracle.truth(root, SID)
    for name in ("bootstrap", checked_prefix.NAME):
        with open(_cache(root, SID, name), "wb") as f:
            f.truncate(256 << 20)
    tracemalloc.start()
    try:
        got = oracle.cold_load(root, SID)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == truth
    assert peak < 32 << 20, f"a cold load of a 20-line session allocated {peak >> 20} MiB"


def _snap(root: Path, sid: str = SID) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in _side_files(root, sid)}


def _plant(root: Path, files: dict[str, bytes], sid: str = SID) -> None:
    for p in _side_files(root, sid):
        p.unlink()
    d = log_path(root, sid).parent
    for name, data in files.items():
        (d / name).write_bytes(data)


@pytest.mark.parametrize(
    "history",
    ["older state", "before compaction", "before repair", "other session", "before removal"],
)
def test_side_files_from_another_time_or_session_never_change_a_load(
    root: Path, history: str
) -> None:
    """Every side file saved at one moment (a fold cache, a checked prefix) planted back
    after the log moved on: appended to, compacted and re-grown past the same seq,
    repaired (a bad middle line cut) and re-grown, removed and re-created with the same
    events, or copied from another session of the same shape. Each load (bootstrap and
    transcript, fresh processes) equals the fold of an undamaged copy of the log."""
    with SessionStore(root) as s:
        _fill_turns(s)
        if history == "other session":
            _fill_turns(s, "t")
    check_whole(root, "t" if history == "other session" else SID)  # and a checked prefix
    stale = _snap(root, "t" if history == "other session" else SID)
    assert any(n.startswith("fold-x") for n in stale) and "fold-bootstrap.cache" in stale
    with SessionStore(root) as s:
        if history == "before compaction":
            assert s.compact(SID, archive=False, force=True).compacted
        elif history == "before repair":
            from eventstore.ops.repair import repair

            log = log_path(root, SID)
            data = log.read_bytes()
            cut = data.index(b'"seq":100,')
            log.write_bytes(data[:cut] + b"X" + data[cut + 1 :])  # a bad line mid-log
            s.close()
            s = SessionStore(root)
            repair(s, SID)
        elif history == "before removal":
            assert s.delete_session(SID, purge=True)
        _fill_turns(s, start=500)  # re-grown well past the seq and size the files vouched for
    truth = oracle.truth(root, SID)
    _plant(root, stale)
    assert oracle.cold_load(root, SID) == truth
    _plant(root, stale)
    with SessionStore(root) as s:  # a warm store catching up under stale files
        s.load_bootstrap_state(SID)
        s.append_progress_entry(SID, make_entry(999))
        assert (s.load_bootstrap_state(SID), s.load_transcript_messages(SID)) == oracle.truth(
            root, SID
        )


def test_a_cache_or_prefix_cut_at_every_byte_is_ignored(root: Path) -> None:
    """The fold cache and the checked prefix, each cut at every length short of whole:
    neither is ever handed to a load (the load path, `fold_cache.load` and
    `checked_prefix.load`, on the real file)."""
    with SessionStore(root) as s:
        _fill_turns(s, turns=70)
    check_whole(root, SID)
    store = SessionStore(root)
    try:
        for name in ("bootstrap", checked_prefix.NAME):
            path = _cache(root, SID, name)
            good = path.read_bytes()
            step = 1 if name != "bootstrap" else max(1, len(good) // 1500)
            cuts = sorted({*range(0, len(good), step), *range(len(good) - 80, len(good))})
            for n in cuts:
                path.write_bytes(good[:n])
                if name == "bootstrap":
                    known = fold_cache.known_types(store.bootstrap, store.codec.types)
                    got = fold_cache.load(store.engine, SID, store.bootstrap, known)
                else:
                    got = checked_prefix.load(store.engine, SID)
                if n == len(good) - 1 and name != "bootstrap":
                    # only the closing newline gone: the same record (its digest is
                    # of the log's bytes, proven again by the load that uses it)
                    assert got == checked_prefix.load(store.engine, SID) or got is None
                    continue
                assert got is None, (name, n, len(good))
            path.write_bytes(good)
    finally:
        store.close()
    assert oracle.cold_load(root, SID) == oracle.truth(root, SID)


def test_racing_cache_savers_a_compactor_and_a_writer_never_change_a_load(root: Path) -> None:
    """Two child processes load and close in a loop (each saves its fold cache and
    checked prefix, racing each other's atomic renames), while the parent appends and
    compacts. Every load in the children and in the parent equals the fold of the log
    as it ends, cut at the seq it reached (the log only grows)."""
    with SessionStore(root) as s:
        _fill_turns(s, turns=40)
    child = textwrap.dedent(
        f"""
        import sys
        from eventstore import SessionStore
        import os, time
        seen, rounds, deadline = 0, 0, time.monotonic() + 30
        while rounds < 3 or not os.path.exists({str(root / "done")!r}):
            assert time.monotonic() < deadline
            rounds += 1
            with SessionStore({str(root)!r}) as s:
                b = s.load_bootstrap_state({SID!r})
                t = s.load_transcript_messages({SID!r})
                n = len(b.recent_progress)
                assert n >= seen and len(t) >= n, (n, seen, len(t))
                assert [m.content.split()[0] for m in t] == [f"m{{i}}" for i in range(len(t))]
                seen = n
            open({str(root)!r} + f"/ready-{{os.getpid()}}", "w").close()
        print(rounds)
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 30
        while len(list(root.glob("ready-*"))) < 2:  # both are loading and closing
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.01)
        with SessionStore(root) as s:
            for k in range(10):
                _fill_turns(s, turns=8, start=40 + 8 * k)
                s.compact(SID, archive=k % 2 == 0, force=True)
        (root / "done").touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert oracle.cold_load(root, SID) == oracle.truth(root, SID)


def test_a_cache_save_killed_midway_leaves_nothing_a_load_trusts(root: Path) -> None:
    """A process SIGKILLed while it writes its fold cache (after the temporary file's
    first bytes, before the rename): the old cache stays whole, the half-written
    temporary file is never read, loads equal the truth, and the next compaction
    sweeps the temporary file away."""
    with SessionStore(root) as s:
        _fill_turns(s)
    before = _cache(root, SID).read_bytes()
    child = textwrap.dedent(
        f"""
        import os, signal
        from eventstore import SessionStore
        from eventstore.engines.file import layout
        real = layout.write_all
        def write_all(fd, data, *, fsync=False):
            real(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        layout.write_all = write_all
        s = SessionStore({str(root)!r})
        s.append_progress_entry({SID!r}, __import__("conftest").make_entry(777))
        s.load_bootstrap_state({SID!r})
        s.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    r = subprocess.run([sys.executable, "-c", child], env=env, timeout=60, capture_output=True)
    assert r.returncode == -9, r.stderr
    d = log_path(root, SID).parent
    assert any(".tmp-" in n for n in os.listdir(d))  # the killed write's debris
    assert _cache(root, SID).read_bytes() == before
    assert oracle.cold_load(root, SID) == oracle.truth(root, SID)
    with SessionStore(root) as s:
        s.compact(SID, force=True)
    assert not any(".tmp-" in n for n in os.listdir(d))
    assert oracle.cold_load(root, SID) == oracle.truth(root, SID)
